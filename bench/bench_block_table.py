"""kvcy.block_table: the slot-mapping op (C++ vs plain torch) and the row edits (Cython vs Python).

Run: ``python -m pytest bench/bench_block_table.py --benchmark-only``.

* ``compute_slot_mapping``: one step of 8,192 scheduled tokens (64 prefill
  chunks of 120 tokens and 512 decodes, block size 16, 256-column table),
  ``torch.ops.kvcy.compute_slot_mapping`` (``cpp``) vs
  ``kvcy._ops_reference.compute_slot_mapping`` (``reference``), on the CPU
  (and CUDA where there is one), with torch on one thread.
* Row edits: each round edits all 256 rows of a table once (``append_row`` of
  one block, as a decode step that crosses a block boundary; ``add_row`` of 64
  blocks, as a newly scheduled request; ``clear_row``; ``move_row`` and
  ``swap_row``, as vLLM's batch condensing and reordering), through the
  compiled twin (``cython``) and the pure one (``python``: numpy slice
  assignments, as vLLM's worker makes them).

A summary at the end prints each group's rows and the slower/faster ratio.
"""

from __future__ import annotations

import random

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from kvcy import _ops_reference as ref  # noqa: E402
from kvcy import ops  # noqa: E402

ROWS, WIDTH, BLOCK = 256, 256, 16
RESULTS: dict[str, dict[str, float]] = {}


def _record(benchmark, group: str, row: str) -> None:
    if benchmark.stats is not None:
        RESULTS.setdefault(group, {})[row] = benchmark.stats.stats.mean


@pytest.fixture(scope="module", autouse=True)
def _summary(write_summary):
    yield
    lines = ["", "kvcy.block_table: mean per round, and the ratio of the slower row to the faster"]
    for group, rows in RESULTS.items():
        text = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in rows.items())
        if len(rows) == 2:
            (a, ta), (b, tb) = sorted(rows.items(), key=lambda kv: kv[1])
            text += f"  ->  {a} {tb / ta:.1f}x faster than {b}"
        lines.append(f"  {group}: {text}")
    write_summary(lines)


# --------------------------------------------------------------------------- slot mapping


def _step(device: str):
    rng = random.Random(0)
    lens = [120] * 64 + [1] * 512
    rng.shuffle(lens)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    assert qsl[-1] == 8192
    pos = []
    for n in lens:
        start = rng.randrange(WIDTH * BLOCK - n)
        pos.extend(range(start, start + n))
    table = torch.randint(1, 100_000, (len(lens), WIDTH), dtype=torch.int32)
    return (torch.tensor(qsl, dtype=torch.int32, device=device), torch.tensor(pos, dtype=torch.int64, device=device),
            table.to(device), torch.empty(8192 + 128, dtype=torch.int64, device=device), len(lens))


OP_ROWS = [
    pytest.param("cpp", marks=pytest.mark.skipif(not ops.HAS_SLOT_MAPPING_KERNEL,
                                                 reason="kvcy._C without compute_slot_mapping")),
    pytest.param("reference"),
]
DEVICES = [
    pytest.param("cpu"),
    pytest.param("cuda", marks=pytest.mark.skipif(not (torch.cuda.is_available() and ops._SLOT_MAPPING_CUDA),
                                                  reason="no CUDA device, or kvcy._C without CUDA kernels")),
]


@pytest.fixture
def one_thread():
    """torch on one thread: on a loaded 2-core box, torch's intra-op threads wait
    for each other (the reference's few small ops took ~60 ms with 2 threads
    under load, ~0.3 ms with one), which would measure the scheduler."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row", OP_ROWS)
def test_compute_slot_mapping(benchmark, row, device, one_thread):
    qsl, pos, table, out, num_reqs = _step(device)
    fn = torch.ops.kvcy.compute_slot_mapping if row == "cpp" else ref.compute_slot_mapping
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        fn(qsl, pos, table, out, num_reqs, BLOCK, 1, 0, 1)
        sync()

    step()
    expect = out.clone()
    ref.compute_slot_mapping(qsl, pos, table, expect, num_reqs, BLOCK)
    assert torch.equal(out, expect)
    group = f"compute_slot_mapping 8192 tokens ({device})"
    benchmark.group = group
    benchmark(step)
    _record(benchmark, group, row)


# --------------------------------------------------------------------------- row edits


def _rows(impl):
    table = np.zeros((ROWS, WIDTH), dtype=np.int32)
    counts = np.zeros(ROWS, dtype=np.int32)
    return impl.block_table.BlockTableRows(table, counts), table, counts


def _fill(rows, n=64):
    for r in range(ROWS):
        rows.add_row(list(range(r * n + 1, r * n + n + 1)), r)


ROW_OPS = ["append_row", "add_row", "clear_row", "move_row", "swap_row"]


@pytest.mark.parametrize("op", ROW_OPS)
def test_row_edits(benchmark, impl, op):
    rows, table, counts = _rows(impl)
    _fill(rows)
    new_ids = [list(range(r * 64 + 1, r * 64 + 65)) for r in range(ROWS)]
    order = list(range(ROWS))
    random.Random(1).shuffle(order)

    if op == "append_row":
        one = [[r + 7] for r in range(ROWS)]

        def round_():
            counts[:] = 64  # every round appends to rows of 64 blocks
            for r in range(ROWS):
                rows.append_row(one[r], r)
    elif op == "add_row":
        def round_():
            for r in range(ROWS):
                rows.add_row(new_ids[r], r)
    elif op == "clear_row":
        def round_():
            counts[:] = 64
            for r in range(ROWS):
                rows.clear_row(r)
    elif op == "move_row":
        def round_():
            counts[:] = 64
            for r in range(ROWS - 1):
                rows.move_row(r + 1, r)
    else:
        def round_():
            for r in range(ROWS):
                rows.swap_row(r, order[r])

    group = f"{op} x{ROWS} rows"
    benchmark.group = group
    benchmark(round_)
    _record(benchmark, group, impl.name)
