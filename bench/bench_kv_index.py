"""The KV-aware routing index (``kvcy.kv_index.KVIndex``): compiled twin vs pure-Python twin.

Run: ``python -m pytest bench/bench_kv_index.py --benchmark-only``.

The fleet: 64 instances.  A request's chain is 1,000 random 64-bit block
hashes; instance ``k`` holds its first ``k * 1000 // 63`` blocks (so one holds
all of them and the walk goes the whole way), plus 2,000 blocks of its own;
about 160,000 entries in all, all in the ``"GPU"`` medium.

One group per operation, with a ``cython`` and a ``python`` row:

* ``longest_prefix, 1,000 blocks x 64 instances``: the query with the chain as
  a list of ints; ``... array('Q')``: the same chain as an ``array('Q')``.
* ``best_instance, ...``: the query plus picking the instance.
* ``apply_events, 64 x 50 blocks stored + removed``: one call applying 64
  ``BlockStored`` events of 50 new hashes, and one applying the matching
  ``BlockRemoved`` events (the index ends each round as it started):
  6,400 blocks per round.

At the end a summary prints, per group, the median (p50) time per call, the
blocks per second for the apply group, and the python/cython ratio of the
medians (one run).
"""

from __future__ import annotations

import random
from array import array

import pytest

from kvcy.kv_events import BlockRemoved, BlockStored

INSTANCES = 64
CHAIN = 1000
OWN = 2000
EVENTS = 64
PER_EVENT = 50

_rng = random.Random(0)
CHAIN_HASHES = [_rng.getrandbits(64) for _ in range(CHAIN)]
RESULTS: dict[str, dict[str, tuple[float, int]]] = {}  # group -> impl -> (median s, blocks per call)


def _stored(hashes):
    return BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=[], block_size=16, lora_id=None,
                       medium="GPU", lora_name=None, group_idx=0)


def _fleet(impl):
    rng = random.Random(1)
    index = impl.kv_index.KVIndex()
    for k in range(INSTANCES):
        held = CHAIN_HASHES[: k * CHAIN // (INSTANCES - 1)]
        index.apply_events(f"10.0.0.{k}:8000", [_stored(held), _stored([rng.getrandbits(64) for _ in range(OWN)])])
    return index


def _run(benchmark, impl, group: str, fn, blocks: int) -> None:
    benchmark.group = group
    fn()  # warm up
    benchmark(fn)
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    median = benchmark.stats.stats.median
    benchmark.extra_info["blocks_per_s"] = round(blocks / median)
    RESULTS.setdefault(group, {})[impl.name] = (median, blocks)


@pytest.fixture
def fleet(impl, freeze_startup_heap):
    index = _fleet(impl)
    freeze_startup_heap()
    return index


def test_longest_prefix(benchmark, impl, fleet):
    want = {f"10.0.0.{k}:8000": k * CHAIN // (INSTANCES - 1) for k in range(INSTANCES)}
    assert fleet.longest_prefix(CHAIN_HASHES) == want
    _run(benchmark, impl, "longest_prefix, 1,000 blocks x 64 instances", lambda: fleet.longest_prefix(CHAIN_HASHES),
         CHAIN)


def test_longest_prefix_array(benchmark, impl, fleet):
    chain = array("Q", CHAIN_HASHES)
    assert fleet.longest_prefix(chain)["10.0.0.63:8000"] == CHAIN
    _run(benchmark, impl, "longest_prefix, 1,000 blocks x 64 instances, array('Q')",
         lambda: fleet.longest_prefix(chain), CHAIN)


def test_best_instance(benchmark, impl, fleet):
    assert fleet.best_instance(CHAIN_HASHES) == ("10.0.0.63:8000", CHAIN)
    _run(benchmark, impl, "best_instance, 1,000 blocks x 64 instances", lambda: fleet.best_instance(CHAIN_HASHES),
         CHAIN)


def test_apply_events(benchmark, impl, fleet):
    rng = random.Random(2)
    batches = [[rng.getrandbits(64) for _ in range(PER_EVENT)] for _ in range(EVENTS)]
    stores = [_stored(hashes) for hashes in batches]
    removes = [BlockRemoved(block_hashes=hashes, medium="GPU", group_idx=0) for hashes in batches]
    before = fleet.num_blocks()

    def run():
        fleet.apply_events("10.0.0.7:8000", stores)
        fleet.apply_events("10.0.0.7:8000", removes)

    run()
    assert fleet.num_blocks() == before
    _run(benchmark, impl, "apply_events, 64 x 50 blocks stored + removed", run, 2 * EVENTS * PER_EVENT)


@pytest.fixture(scope="module", autouse=True)
def _summary(write_summary):
    yield
    if not RESULTS:
        return
    lines = ["", "kvcy KV index: median (p50) per call, blocks/s, python/cython (medians of this run)"]
    for group, rows in RESULTS.items():
        parts = []
        for name in ("cython", "python"):
            if name in rows:
                median, blocks = rows[name]
                parts.append(f"{name} {median * 1e6:9.2f} us {blocks / median / 1e6:8.2f} M blocks/s")
        if "cython" in rows and "python" in rows:
            parts.append(f"ratio {rows['python'][0] / rows['cython'][0]:6.1f}x")
        lines.append(f"  {group:<56} " + " | ".join(parts))
    write_summary(lines)
