"""The KV-aware routing index (kvcy.kv_index.KVIndex), run against both twins.

Semantics (stores, removals, clears, mediums, duplicates, the ``max_blocks``
bound), bad input (refused before any change, with the same messages in both
twins), a hypothesis differential test of both twins against a plain reference
model, and the index fed by real ``KVCacheManager`` events answering exactly
the manager's own cache hits.
"""

from __future__ import annotations

import array
import random
import sys
from collections import Counter, OrderedDict

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcy
from kvcy import _fast, kv_index
from kvcy.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEventBatch, external_block_hash


@pytest.fixture
def KVIndex(impl):
    """The ``KVIndex`` class of one twin (conftest's ``impl`` fixture: ids ``cython`` / ``python``)."""
    return impl.kv_index.KVIndex


def stored(hashes, medium="GPU", **kw):
    kw.setdefault("group_idx", 0)
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[], block_size=16,
                       lora_id=None, medium=medium, lora_name=None, **kw)


def removed(hashes, medium="GPU", **kw):
    return BlockRemoved(block_hashes=list(hashes), medium=medium, **kw)


def snapshot(index, queries=((1, 2, 3, 4),)):
    """Everything observable about an index, for before/after comparisons."""
    return (index.instances, index.mediums, index.stats, index.num_blocks(),
            {name: index.num_blocks(name) for name in index.instances},
            [index.longest_prefix(list(q)) for q in queries])


# --------------------------------------------------------------------------- selection
def test_public_module_exports_the_selected_twin():
    from kvcy import kv_index

    assert kv_index.IMPLEMENTATION == kvcy.IMPLEMENTATION
    assert kv_index.KVIndex is _fast.kv_index.KVIndex
    assert kv_index.KVIndex.__module__ == f"kvcy._fast._kv_index_{'c' if kvcy.IMPLEMENTATION == 'cython' else 'py'}"


# --------------------------------------------------------------------------- semantics
def test_stored_removed_cleared(KVIndex):
    index = KVIndex()
    assert index.apply_events("a", [stored([1, 2, 3, 4])]) == 1
    assert index.apply_events("b", [stored([1, 2]), stored([7])]) == 2
    assert index.instances == ("a", "b")
    assert index.longest_prefix([1, 2, 3, 4, 5]) == {"a": 4, "b": 2}
    assert index.longest_prefix([7, 2, 3]) == {"a": 0, "b": 2}
    assert index.longest_prefix([]) == {"a": 0, "b": 0}
    assert index.best_instance([1, 2, 3]) == ("a", 3)
    # A hole in the chain ends the prefix even when later hashes are held.
    index.apply_events("a", [removed([2])])
    assert index.longest_prefix([1, 2, 3, 4]) == {"a": 1, "b": 2}
    assert index.best_instance([1, 2, 3]) == ("b", 2)
    index.apply_events("b", [AllBlocksCleared()])
    assert index.longest_prefix([1, 2, 3]) == {"a": 1, "b": 0}
    assert index.num_blocks("b") == 0 and index.num_blocks("a") == 3 and index.num_blocks() == 3
    s = index.stats
    assert (s["events_applied"], s["blocks_stored"], s["blocks_removed"], s["removals_unknown"]) == (5, 7, 1, 0)
    assert (s["all_blocks_cleared"], s["entries_cleared"], s["entries"], s["hashes"], s["instances"]) == (1, 3, 3, 3, 2)


def test_apply_batch_any_rank_and_empty_batch_makes_the_instance_known(KVIndex):
    index = KVIndex()
    batch = KVEventBatch(ts=1.0, events=[stored([5, 6])], data_parallel_rank=3)
    assert index.apply_batch("x", batch) == 1
    assert index.apply_batch("y", KVEventBatch(ts=2.0, events=[])) == 0
    assert index.longest_prefix([5, 6]) == {"x": 2, "y": 0}
    assert index.stats["batches_applied"] == 2
    with pytest.raises(TypeError, match="batch must be a KVEventBatch, got list"):
        index.apply_batch("x", [stored([1])])


class ThirdPartyStored(msgspec.Struct, omit_defaults=True, tag="BlockStored"):
    """Another library's copy of the event (vLLM's own, or a consumer's): same wire form."""

    block_hashes: list
    parent_block_hash: int | None
    token_ids: list
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class ThirdPartyBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: int | None = None


def test_apply_batch_reads_another_librarys_batch_by_its_wire_form(KVIndex):
    """vLLM's own KVEventBatch (or any struct encoding as one) applies as it decodes off the
    wire; a struct that does not is refused before anything changes."""
    index = KVIndex()
    event = ThirdPartyStored([5, 6], None, list(range(8)), 4, None, "CPU", None)
    assert index.apply_batch("x", ThirdPartyBatch(1.0, [event])) == 1
    assert index.apply_batch("x", EventBatch(ts=2.0, events=[stored([7])])) == 1  # the untyped base class
    assert index.longest_prefix([5, 6, 7], medium="CPU") == {"x": 2}
    assert index.longest_prefix([7]) == {"x": 1}
    assert index.stats["batches_applied"] == 2
    for bad in (ThirdPartyBatch(1.0, [ThirdPartyBatch(0.0, [])]), event):
        with pytest.raises(TypeError, match=f"batch must be a KVEventBatch, got {type(bad).__name__}"):
            index.apply_batch("y", bad)
    assert index.instances == ("x",) and index.stats["batches_applied"] == 2


def test_mediums_are_kept_apart(KVIndex):
    index = KVIndex()
    index.apply_events("a", [stored([1, 2, 3], "GPU"), stored([1, 2, 3, 4], "CPU")])
    index.apply_events("b", [stored([1, 2], None)])
    assert index.mediums == ("GPU", "CPU", None)
    index.apply_events("b", [removed([1], "disk")])  # a medium seen in a removal is known too
    assert index.mediums == ("GPU", "CPU", None, "disk") and index.stats["removals_unknown"] == 1
    assert index.num_blocks("a") == 7
    assert index.longest_prefix([1, 2, 3, 4]) == {"a": 4, "b": 2}
    assert index.longest_prefix([1, 2, 3, 4], medium="GPU") == {"a": 3, "b": 0}
    assert index.longest_prefix([1, 2, 3, 4], medium="CPU") == {"a": 4, "b": 0}
    assert index.longest_prefix([1, 2, 3, 4], medium="disk") == {"a": 0, "b": 0}
    # Removing from the GPU leaves the CPU copy: still held in "any medium".
    index.apply_events("a", [removed([1], "GPU")])
    assert index.longest_prefix([1, 2, 3, 4], medium="GPU") == {"a": 0, "b": 0}
    assert index.longest_prefix([1, 2, 3, 4]) == {"a": 4, "b": 2}
    index.apply_events("a", [removed([2], "CPU")])
    assert index.longest_prefix([1, 2, 3, 4]) == {"a": 4, "b": 2}  # 1 on the CPU, 2 on the GPU
    index.apply_events("a", [removed([2], "GPU")])
    assert index.longest_prefix([1, 2, 3, 4]) == {"a": 1, "b": 2}
    # AllBlocksCleared forgets every medium.
    index.apply_events("a", [AllBlocksCleared()])
    assert index.num_blocks("a") == 0 and index.longest_prefix([1]) == {"a": 0, "b": 1}


def test_duplicates_are_counted(KVIndex):
    """Two groups (or two blocks of one group) storing a hash: one removal leaves it held."""
    index = KVIndex()
    index.apply_events("a", [stored([1, 2], group_idx=0), stored([1, 2], group_idx=1)])
    assert index.num_blocks("a") == 2 and index.stats["blocks_stored"] == 4
    index.apply_events("a", [removed([1], group_idx=1)])
    assert index.longest_prefix([1, 2]) == {"a": 2}
    index.apply_events("a", [removed([1], group_idx=0)])
    assert index.longest_prefix([1, 2]) == {"a": 0}
    # A third removal is of a hash no longer held: a counted no-op.
    index.apply_events("a", [removed([1, 99])])
    assert index.stats["removals_unknown"] == 2 and index.stats["blocks_removed"] == 2
    assert index.num_blocks("a") == 1


def test_int_and_bytes_hashes_are_distinct(KVIndex):
    index = KVIndex()
    index.apply_events("a", [stored([5, b"\x05", b"\x00" * 7 + b"\x05", b"x" * 32])])
    assert index.num_blocks("a") == 4 and index.stats["hashes"] == 4
    assert index.longest_prefix([5, b"\x05", b"\x00" * 7 + b"\x05", b"x" * 32]) == {"a": 4}
    assert index.longest_prefix([b"\x05"]) == {"a": 1}
    assert index.longest_prefix([b"y" * 32]) == {"a": 0}
    index.apply_events("a", [removed([b"\x05"])])
    assert index.longest_prefix([5]) == {"a": 1} and index.longest_prefix([b"\x05"]) == {"a": 0}
    # bytes equal in value to a held one, but another object: found.
    assert index.longest_prefix([bytes(bytearray(b"x" * 32))], medium="GPU") == {"a": 1}


def test_extreme_int_hashes(KVIndex):
    index = KVIndex()
    top = (1 << 64) - 1
    index.apply_events("a", [stored([0, top, 1 << 63])])
    assert index.longest_prefix([0, top, 1 << 63]) == {"a": 3}


def test_lora_fields_are_ignored(KVIndex):
    index = KVIndex()
    index.apply_events("a", [BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[1], block_size=16,
                                         lora_id=7, medium="GPU", lora_name="adapter")])
    assert index.longest_prefix([1, 2]) == {"a": 2}


def test_max_blocks_drops_the_least_recently_stored(KVIndex):
    index = KVIndex(max_blocks=3)
    assert index.max_blocks == 3
    index.apply_events("a", [stored([1, 2, 3])])
    index.apply_events("b", [stored([1])])  # drops a's 1
    assert index.longest_prefix([1, 2, 3]) == {"a": 0, "b": 1}
    assert index.stats["entries_dropped"] == 1 and index.num_blocks() == 3
    index.apply_events("a", [stored([2])])  # stored again: now the most recent (count 2)
    index.apply_events("b", [stored([7])])  # drops a's 3, the least recently stored
    assert index.num_blocks("a") == 1 and index.stats["entries_dropped"] == 2
    assert index.longest_prefix([2]) == {"a": 1, "b": 0}
    # A dropped entry's removal is unknown.
    index.apply_events("a", [removed([3])])
    assert index.stats["removals_unknown"] == 1
    # One batch larger than the bound keeps its last entries.
    big = KVIndex(max_blocks=2)
    big.apply_events("a", [stored([1, 2, 3, 4, 5])])
    assert big.num_blocks() == 2 and big.longest_prefix([4, 5]) == {"a": 2}
    assert big.longest_prefix([1]) == {"a": 0} and big.stats["entries_dropped"] == 3
    with pytest.raises(ValueError, match="max_blocks must be at least 1"):
        KVIndex(max_blocks=0)
    with pytest.raises(TypeError, match="max_blocks must be an int or None, got float"):
        KVIndex(max_blocks=2.0)


def test_remove_instance_and_clear(KVIndex):
    index = KVIndex()
    index.apply_events("a", [stored([1, 2])])
    index.apply_events("b", [stored([1])])
    index.remove_instance("a")
    index.remove_instance("nobody")  # a no-op
    assert index.instances == ("b",) and index.num_blocks("a") == 0
    assert index.longest_prefix([1, 2]) == {"b": 1}
    assert index.stats["instances_removed"] == 1 and index.stats["hashes"] == 1
    index.apply_events("a", [])  # seen again: last in the order, holding nothing
    assert index.instances == ("b", "a") and index.longest_prefix([1]) == {"b": 1, "a": 0}
    index.clear()
    assert index.instances == () and index.mediums == () and index.num_blocks() == 0
    assert index.longest_prefix([1]) == {} and index.best_instance([1]) == (None, 0)
    assert index.stats["events_applied"] == 2 and index.stats["instances_removed"] == 1  # kept by clear()
    index.apply_events("c", [stored([1])])
    assert index.longest_prefix([1]) == {"c": 1}


def test_many_instances(KVIndex):
    """More instances than one 64-bit word, removed and re-added (their places reused)."""
    index = KVIndex()
    names = [f"i{k}" for k in range(150)]
    chain = list(range(1000, 1200))
    for k, name in enumerate(names):
        index.apply_events(name, [stored(chain[:k])])
    assert index.longest_prefix(chain) == {name: k for k, name in enumerate(names)}
    assert index.best_instance(chain) == ("i149", 149)
    assert index.best_instance(chain, candidates=["i3", "i70", "zzz"]) == ("i70", 70)
    for name in names[::3]:
        index.remove_instance(name)
    for k in range(150, 170):
        index.apply_events(f"i{k}", [stored(chain[:k - 100])])
    expect = {name: k for k, name in enumerate(names) if k % 3} | {f"i{k}": k - 100 for k in range(150, 170)}
    assert index.longest_prefix(chain) == expect
    assert list(index.instances) == list(expect)
    assert index.num_blocks() == sum(expect.values())


def test_best_instance_ties_and_candidates(KVIndex):
    index = KVIndex()
    index.apply_events("a", [stored([1])])
    index.apply_events("b", [stored([1, 2])])
    index.apply_events("c", [stored([1, 2])])
    assert index.best_instance([1, 2]) == ("b", 2)
    assert index.best_instance([1, 2], candidates=("c", "b")) == ("c", 2)
    assert index.best_instance([9], candidates=["new", "a"]) == ("new", 0)
    assert index.best_instance([1], candidates=[]) == (None, 0)
    with pytest.raises(TypeError, match="a candidate must be a str, got int"):
        index.best_instance([1], candidates=[3])
    with pytest.raises(TypeError, match="candidates must be a sequence of instance names, got str"):
        index.best_instance([1], candidates="a")


def test_queries_take_buffers_and_iterables(KVIndex):
    index = KVIndex()
    chain = [(k * 0x9E3779B97F4A7C15) % (1 << 64) for k in range(1, 50)]
    index.apply_events("a", [stored(chain[:30])])
    index.apply_events("b", [stored(chain)])
    want = {"a": 30, "b": 49}
    assert index.longest_prefix(array.array("Q", chain)) == want
    assert index.longest_prefix(memoryview(array.array("Q", chain))) == want
    assert index.longest_prefix(tuple(chain)) == want
    assert index.longest_prefix(iter(chain)) == want
    assert index.longest_prefix(array.array("Q")) == {"a": 0, "b": 0}
    np = pytest.importorskip("numpy")
    assert index.longest_prefix(np.array(chain, dtype=np.uint64)) == want
    with pytest.raises(TypeError, match="format 'q' with 1 dimension"):
        index.longest_prefix(array.array("q", [1]))
    with pytest.raises(TypeError, match="C-contiguous"):
        index.longest_prefix(np.array(chain, dtype=np.uint64)[::2])
    with pytest.raises(TypeError, match="block_hashes must be a sequence of block hashes, got bytes"):
        index.longest_prefix(b"\x01" * 8)


# --------------------------------------------------------------------------- bad input
BAD_EVENTS = [
    ([stored([1]), "junk"], TypeError, "events[1] is not a BlockStored, BlockRemoved or AllBlocksCleared: str"),
    ([stored([1]), stored([2, -1])], ValueError, "events[1].block_hashes[1]: block hash -1 is not an unsigned 64-bit"),
    ([stored([1 << 64])], ValueError, "events[0].block_hashes[0]: block hash 18446744073709551616 is not"),
    ([stored([1, 2.0])], TypeError, "events[0].block_hashes[1]: a block hash is an int or bytes, got float"),
    ([stored([True])], TypeError, "events[0].block_hashes[0]: a block hash is an int or bytes, got bool"),
    ([removed([bytearray(b"x")])], TypeError, "a block hash is an int or bytes, got bytearray"),
    ([stored([1], medium=3)], TypeError, "events[0].medium must be a str or None, got int"),
    ([AllBlocksCleared(), BlockStored(block_hashes="ab", parent_block_hash=None, token_ids=[], block_size=16,
                                      lora_id=None, medium="GPU", lora_name=None)], TypeError, "events[1].block_hashes must be a list of block hashes, got str"),
    (stored([1]), TypeError, "not iterable"),
]


@pytest.mark.parametrize(("events", "exc", "message"), BAD_EVENTS)
def test_bad_events_change_nothing(KVIndex, events, exc, message):
    index = KVIndex(max_blocks=4)
    index.apply_events("a", [stored([1, 2, 3])])
    index.apply_events("b", [stored([1], "CPU")])
    before = snapshot(index)
    for who in ("a", "new"):
        with pytest.raises(exc) as info:
            index.apply_events(who, events)
        assert message in str(info.value)
        if isinstance(events, list):
            with pytest.raises(exc):
                index.apply_batch(who, KVEventBatch(ts=0.0, events=events))
    assert snapshot(index) == before


def test_bad_names_and_queries(KVIndex):
    index = KVIndex()
    index.apply_events("a", [stored([1, 2])])
    before = snapshot(index)
    with pytest.raises(TypeError, match="instance must be a str, got int"):
        index.apply_events(3, [stored([1])])
    with pytest.raises(TypeError, match="instance must be a str, got NoneType"):
        index.remove_instance(None)
    with pytest.raises(TypeError, match="instance must be a str, got bytes"):
        index.num_blocks(b"a")
    with pytest.raises(TypeError, match=r"block_hashes\[1\]: a block hash is an int or bytes, got str"):
        index.longest_prefix([1, "2"])
    # Every hash is checked, also past where the walk stops.
    with pytest.raises(ValueError, match=r"block_hashes\[3\]: block hash -5 is not an unsigned 64-bit int"):
        index.longest_prefix([9, 1, 2, -5])
    with pytest.raises(TypeError, match="medium must be a str or None, got int"):
        index.longest_prefix([1], medium=0)
    assert snapshot(index) == before


def test_too_many_mediums_is_refused_unchanged(KVIndex):
    """At most MAX_MEDIUMS mediums in use; None, GPU, CPU and STORAGE always find a place."""
    assert (kv_index.MAX_MEDIUMS, kv_index.MAX_INSTANCE_MEDIUMS) == (256, 8)
    index = KVIndex()
    for i in range(31):  # 248 other mediums
        index.apply_events(f"i{i}", [stored([i], f"m{i}.{k}") for k in range(8)])
    index.apply_events("a", [stored([1], f"a{k}") for k in range(2)])
    before = snapshot(index)
    with pytest.raises(ValueError, match="the index holds at most 256 mediums"):
        index.apply_events("a", [stored([1], f"n{k}") for k in range(3)])
    assert snapshot(index) == before
    index.apply_events("a", [stored([1], f"n{k}") for k in range(2)])
    with pytest.raises(ValueError, match="the index holds at most 256 mediums"):
        index.apply_events("b", [stored([1], "one-too-many")])
    index.apply_events("b", [stored([1], m) for m in ("GPU", "CPU", "STORAGE", None)])
    assert len(index.mediums) == 256 and index.num_blocks("b") == 4


def test_one_instance_cannot_fill_the_medium_table(KVIndex):
    """One publisher naming ever new mediums took the compiled index from 32 to 542 MiB and
    refused every other instance's first CPU store until clear(): an instance names at most
    MAX_INSTANCE_MEDIUMS others, and its mediums (and their memory) go when it is removed."""
    hashes = list(range(1, 4001))
    index = KVIndex()
    index.apply_events("good", [stored(hashes, "GPU")])
    index.apply_events("evil", [stored([1], f"x{k}") for k in range(8)])
    before = snapshot(index)
    with pytest.raises(ValueError, match="^instance 'evil' names more than 8 mediums besides GPU, CPU, STORAGE "
                                         "and None$"):
        index.apply_events("evil", [stored([1], "x8")])
    assert snapshot(index) == before
    index.apply_events("evil", [stored([1], m) for m in ("GPU", "CPU", "STORAGE", None)])  # not counted
    index.apply_events("evil", [removed([1], "x0")])  # one it named already
    index.apply_events("other", [stored([5], "CPU"), stored([6], "x0")])
    grown = index.memory_bytes
    index.remove_instance("evil")
    assert index.mediums == ("GPU", "x0", "CPU")  # x0 is other's too
    index.remove_instance("other")
    assert index.mediums == ("GPU",)
    fresh = KVIndex()
    fresh.apply_events("good", [stored(hashes, "GPU")])
    assert index.memory_bytes <= fresh.memory_bytes + 4096 < grown
    assert index.longest_prefix(hashes) == {"good": 4000} and index.longest_prefix([1], "x1") == {"good": 0}
    index.apply_events("evil", [stored([1], f"y{k}") for k in range(8)])  # a new life, a new bound
    assert len(index.mediums) == 9


def test_twins_refuse_alike():
    """Same exception type and message from both twins for every bad call above."""
    impls = [i for i in ("cython", "python") if i in _fast.available() and not (i == "cython" and _fast.NO_EXTENSIONS)]
    if len(impls) < 2:
        pytest.skip("needs both twins")
    calls = [lambda ix, ev=ev: ix.apply_events("a", ev) for ev, _, _ in BAD_EVENTS]
    calls += [lambda ix: ix.longest_prefix([1, 2, 3.5]), lambda ix: ix.longest_prefix(array.array("d", [1.0])),
              lambda ix: ix.longest_prefix(5), lambda ix: ix.best_instance([1], candidates=[b"x"]),
              lambda ix: ix.apply_batch("a", None)]
    for call in calls:
        outcomes = []
        for impl in impls:
            try:
                call(_fast.load(impl)["kv_index"].KVIndex())
            except Exception as exc:  # noqa: BLE001 - the point is to compare them
                outcomes.append((type(exc), str(exc)))
            else:
                outcomes.append(None)
        assert outcomes[0] is not None and outcomes[0] == outcomes[1], outcomes


# --------------------------------------------------------------------------- differential
class Model:
    """The reference: per (instance, medium) a Counter of hashes, and the store order for the bound."""

    def __init__(self, max_blocks=None):
        self.max_blocks = max_blocks
        self.held: dict[str, dict[object, Counter]] = {}
        self.order: OrderedDict[tuple, None] = OrderedDict()  # (instance, medium, hash), least recent first

    def apply(self, instance, events):
        self.held.setdefault(instance, {})
        for ev in events:
            if isinstance(ev, AllBlocksCleared):
                for medium, counts in self.held[instance].items():
                    for h in counts:
                        del self.order[(instance, medium, h)]
                self.held[instance] = {}
                continue
            counts = self.held[instance].setdefault(ev.medium, Counter())
            for h in ev.block_hashes:
                key = (instance, ev.medium, h)
                if isinstance(ev, BlockStored):
                    if h not in counts and self.max_blocks is not None and len(self.order) >= self.max_blocks:
                        vi, vm, vh = next(iter(self.order))
                        del self.order[(vi, vm, vh)]
                        del self.held[vi][vm][vh]
                    counts[h] += 1
                    self.order[key] = None
                    self.order.move_to_end(key)
                elif h in counts:
                    counts[h] -= 1
                    if counts[h] == 0:
                        del counts[h]
                        del self.order[key]

    def remove(self, instance):
        for medium, counts in self.held.pop(instance, {}).items():
            for h in counts:
                del self.order[(instance, medium, h)]

    def longest_prefix(self, hashes, medium):
        out = {}
        for name, by_medium in self.held.items():
            n = 0
            while n < len(hashes) and any(hashes[n] in c for m, c in by_medium.items() if medium in (None, m)):
                n += 1
            out[name] = n
        return out

    def num_blocks(self, instance):
        return sum(len(c) for c in self.held.get(instance, {}).values())


HASHES = st.one_of(st.integers(0, 12), st.sampled_from([b"\x01", b"\x02" * 32, 1 << 63, (1 << 64) - 1]))
EVENTS = st.one_of(
    st.builds(lambda hs, m: stored(hs, m), st.lists(HASHES, max_size=6), st.sampled_from(["GPU", "CPU", None])),
    st.builds(lambda hs, m: removed(hs, m), st.lists(HASHES, max_size=4), st.sampled_from(["GPU", "CPU", None])),
    st.just(AllBlocksCleared()),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("apply"), st.sampled_from([f"i{k}" for k in range(70)] + ["a", "b"]),
                  st.lists(EVENTS, max_size=4)),
        st.tuples(st.just("remove"), st.sampled_from(["a", "b", "i3", "i65"]), st.none()),
        st.tuples(st.just("query"), st.lists(HASHES, max_size=8), st.sampled_from([None, "GPU", "CPU"])),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, max_blocks=st.one_of(st.none(), st.integers(1, 20)))
def test_twins_match_the_reference_model(ops, max_blocks):
    twins = [_fast.load(i)["kv_index"].KVIndex(max_blocks) for i in _fast.available()
             if not (i == "cython" and _fast.NO_EXTENSIONS)]
    model = Model(max_blocks)
    for op, a, b in ops:
        if op == "apply":
            model.apply(a, b)
            for ix in twins:
                assert ix.apply_events(a, b) == len(b)
        elif op == "remove":
            model.remove(a)
            for ix in twins:
                ix.remove_instance(a)
        else:
            want = model.longest_prefix(a, b)
            for ix in twins:
                got = ix.longest_prefix(a, b)
                assert got == want and list(got) == list(model.held)
        for ix in twins:
            assert ix.instances == tuple(model.held)
            assert ix.num_blocks() == len(model.order)
            assert ix.mediums == twins[0].mediums
    for ix in twins:
        for name in model.held:
            assert ix.num_blocks(name) == model.num_blocks(name)
        assert ix.stats == twins[0].stats
        assert ix.stats["hashes"] == len({h for (_, _, h) in model.order})


# --------------------------------------------------------------------------- real manager events
@pytest.mark.parametrize("use_int", [True, False])
def test_index_of_manager_events_gives_the_managers_cache_hits(impl, use_int):
    """Two KVCacheManagers as two instances: after a random workload (with evictions and a
    reset), the index's prefix for a request equals each manager's own cache hit."""
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    bs = 4
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    config = KVCacheConfig(num_blocks=24, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    managers = {name: impl.kv_cache.KVCacheManager(config, max_model_len=256, scheduler_block_size=bs,
                                                   hash_block_size=bs, enable_kv_cache_events=True,
                                                   use_int_block_hashes=use_int)
                for name in ("a", "b")}
    index = impl.kv_index.KVIndex()
    rng = random.Random(7)
    prefixes = [[rng.randrange(1000) for _ in range(40)] for _ in range(3)]

    def prompt():
        base = rng.choice(prefixes)
        return base[:rng.randrange(4, 40)] + [rng.randrange(1000) for _ in range(rng.randrange(0, 9))]

    def hits(mgr, tokens):
        req = impl.kv_cache.Request("q", tokens, block_hasher=hasher)
        _, num_tokens, _ = mgr.get_computed_blocks(req)
        return req, num_tokens // bs

    checked = 0
    for step in range(60):
        name = rng.choice("ab")
        mgr = managers[name]
        req = impl.kv_cache.Request(f"r{step}", prompt(), block_hasher=hasher)
        blocks, num_computed, _ = mgr.get_computed_blocks(req)
        if mgr.allocate_slots(req, req.num_tokens - num_computed, num_new_computed_tokens=num_computed,
                              new_computed_blocks=blocks) is not None:
            mgr.free(req)
        if step == 30:
            managers["b"].reset_prefix_cache()
        for who, m in managers.items():
            events = m.take_events()
            index.apply_batch(who, KVEventBatch(ts=float(step), events=events))
        tokens = prompt() + [1]  # one more token: every full block may be a hit
        query = None
        want = {}
        for who, m in managers.items():
            req, n = hits(m, tokens)
            query = [external_block_hash(h, use_int) for h in req.block_hashes]
            want[who] = n
        assert index.longest_prefix(query) == want
        checked += sum(1 for n in want.values() if n)
    assert checked > 20  # the workload does hit
    assert index.stats["blocks_removed"] > 0 and index.stats["all_blocks_cleared"] == 1


# --------------------------------------------------------------------------- scale, memory, references
def test_twins_agree_under_churn():
    """A seeded stress run (tables grown, rehashed and shrunk by deletions, 200 instances, the bound
    hit, instances removed and re-added): both twins answer every query and count alike."""
    impls = [i for i in ("cython", "python") if i in _fast.available() and not (i == "cython" and _fast.NO_EXTENSIONS)]
    if len(impls) < 2:
        pytest.skip("needs both twins")
    rng = random.Random(11)
    twins = [_fast.load(i)["kv_index"].KVIndex(max_blocks=6000) for i in impls]
    chains = [[rng.getrandbits(64) for _ in range(60)] for _ in range(8)] + [
        [rng.randbytes(32) for _ in range(30)] for _ in range(2)]
    names = [f"n{k}" for k in range(200)]
    for step in range(1500):
        name = rng.choice(names)
        chain = rng.choice(chains)
        r = rng.random()
        if r < 0.5:
            events = [stored(chain[: rng.randrange(1, len(chain) + 1)], rng.choice(["GPU", "CPU"]))]
        elif r < 0.9:
            start = rng.randrange(len(chain))
            events = [removed(chain[start:start + rng.randrange(1, 10)], rng.choice(["GPU", "CPU"]))]
        elif r < 0.97:
            events = [AllBlocksCleared()]
        else:
            for ix in twins:
                ix.remove_instance(name)
            continue
        for ix in twins:
            ix.apply_events(name, events)
        if step % 50 == 0:
            q = rng.choice(chains)
            medium = rng.choice([None, "GPU", "CPU"])
            answers = [ix.longest_prefix(q, medium) for ix in twins]
            assert answers[0] == answers[1]
            assert [ix.best_instance(q, medium) for ix in twins][0] == twins[1].best_instance(q, medium)
    assert twins[0].stats == twins[1].stats
    assert twins[0].stats["entries_dropped"] > 0 and twins[0].stats["instances"] > 64
    assert [ix.num_blocks(n) for n in names for ix in twins[:1]] == [twins[1].num_blocks(n) for n in names]
    assert twins[0].instances == twins[1].instances and twins[0].mediums == twins[1].mediums


def test_bytes_hashes_are_released(KVIndex):
    key = bytes(range(32))
    base = sys.getrefcount(key)
    index = KVIndex()
    index.apply_events("a", [stored([key], "GPU"), stored([key], "CPU")])
    index.apply_events("b", [stored([key])])
    assert sys.getrefcount(key) > base
    index.apply_events("a", [removed([key], "GPU"), removed([key], "CPU")])
    index.remove_instance("b")
    assert index.stats["hashes"] == 0 and sys.getrefcount(key) == base
    index.apply_events("a", [stored([key])])
    index.clear()
    assert sys.getrefcount(key) == base
    index.apply_events("a", [stored([key])])
    del index
    assert sys.getrefcount(key) == base


def test_memory_bytes_grows_with_the_index(KVIndex):
    index = KVIndex()
    empty = index.memory_bytes
    assert empty > 0
    index.apply_events("a", [stored(range(20_000))])
    assert index.memory_bytes > empty + 20_000 * 16


def test_no_pickling_or_copying(KVIndex):
    import copy
    import pickle

    index = KVIndex()
    index.apply_events("a", [stored([1])])
    for fn in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="a KVIndex cannot be pickled or copied"):
            fn(index)


def test_init_again_starts_afresh(KVIndex):
    index = KVIndex()
    index.apply_events("a", [stored([1, 2])])
    index.__init__(max_blocks=1)
    assert index.instances == () and index.num_blocks() == 0 and index.stats["events_applied"] == 0
    assert index.max_blocks == 1
    index.apply_events("a", [stored([1, 2])])
    assert index.num_blocks() == 1 and index.longest_prefix([2]) == {"a": 1}


def test_str_subclass_names_are_kept_as_plain_str(KVIndex):
    class Name(str):
        def __hash__(self):
            raise AssertionError("the index hashes the plain str")

    index = KVIndex()
    index.apply_events(Name("a"), [stored([1])])
    (name,) = index.instances
    assert type(name) is str and name == "a"
    assert index.longest_prefix([1]) == {"a": 1}
    assert index.best_instance([1], candidates=[Name("a")]) == ("a", 1)
    index.remove_instance(Name("a"))
    assert index.instances == ()


def test_finalizers_that_change_the_index_mid_call_do_not_crash(KVIndex):
    """Garbage collection can run Python code (a finalizer) wherever an object is allocated;
    here finalizers change the index and the hash lists while calls are under way."""
    import gc

    index = KVIndex(max_blocks=500)
    rng = random.Random(5)
    hashes = [rng.getrandbits(64) for _ in range(300)]
    events = [stored(hashes[:200]), removed(hashes[50:80]), stored([bytes([k]) * 32 for k in range(20)])]

    class Meddler:
        def __init__(self, k):
            self.cycle = self
            self.k = k

        def __del__(self):
            k = self.k
            if k % 4 == 0:
                index.apply_events(f"m{k % 7}", [stored(hashes[k % 50: k % 50 + 30])])
            elif k % 4 == 1:
                index.remove_instance(f"m{k % 7}")
            elif k % 4 == 2:
                hashes.append(rng.getrandbits(64))
                del hashes[0]
            else:
                index.longest_prefix(hashes[:40])

    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        for k in range(300):
            Meddler(k)
            index.apply_events(f"i{k % 9}", events)
            index.longest_prefix(hashes)
            index.longest_prefix(array.array("Q", hashes[:100]))
            if k % 50 == 0:
                index.clear()
    finally:
        gc.set_threshold(*old)
        gc.collect()
    assert index.num_blocks() == sum(index.num_blocks(name) for name in index.instances) <= 500


def test_hybrid_manager_events_count_each_group(impl):
    """A full-attention + sliding-window manager caches a hash once per group and evicts each
    copy apart: the index holds a hash exactly while some group's prefix cache does."""
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    bs = 4
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))
    specs = [FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16"),
             SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)]
    config = KVCacheConfig(num_blocks=40, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    mgr = impl.kv_cache.KVCacheManager(config, max_model_len=256, scheduler_block_size=bs, hash_block_size=bs,
                                       enable_kv_cache_events=True)
    index = impl.kv_index.KVIndex()
    rng = random.Random(3)
    prefixes = [[rng.randrange(1000) for _ in range(48)] for _ in range(3)]
    one_group_only = 0
    for step in range(50):
        tokens = rng.choice(prefixes)[: rng.randrange(8, 48)] + [rng.randrange(1000) for _ in range(rng.randrange(4))]
        req = impl.kv_cache.Request(f"r{step}", tokens, block_hasher=hasher)
        blocks, num_computed, _ = mgr.get_computed_blocks(req)
        if mgr.allocate_slots(req, req.num_tokens - num_computed, num_new_computed_tokens=num_computed,
                              new_computed_blocks=blocks) is not None:
            mgr.free(req)
        index.apply_events("m", mgr.take_events())
        probe = impl.kv_cache.Request("probe", rng.choice(prefixes), block_hasher=hasher)
        held = [[mgr.block_pool.get_cached_block(h, [g]) is not None for g in (0, 1)] for h in probe.block_hashes]
        one_group_only += sum(1 for groups in held if groups[0] != groups[1])
        want = next((i for i, groups in enumerate(held) if not any(groups)), len(held))
        query = [external_block_hash(h, True) for h in probe.block_hashes]
        assert index.longest_prefix(query) == {"m": want}
    assert one_group_only > 0  # some hashes were held by one group only: the counts mattered
    assert index.stats["blocks_removed"] > 0


def test_readme_example_prints_what_it_says(capsys):
    """README's "KV-aware routing index" example runs, and prints what its comments say."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## KV-aware routing index"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[: code.index("```")]
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    promised = [line.split("# ", 1)[1].strip() for line in code.splitlines() if line.startswith("print(")]
    assert printed == promised and len(printed) == 4


def test_int_subclass_hashes_are_kept_by_value(KVIndex):
    # The compiled twin keys an int hash by its value; the pure one used the object itself, so
    # an int subclass's own __hash__/__eq__ decided its lookups there and the twins disagreed.
    class Hash(int):
        def __hash__(self):
            return 7

        def __eq__(self, other):
            return True

    index = KVIndex()
    index.apply_events("a", [stored([Hash(5), 6])])
    assert index.longest_prefix([9]) == {"a": 0}
    assert index.longest_prefix([5, 6]) == {"a": 2}
    assert index.longest_prefix([Hash(5), Hash(6), Hash(8)]) == {"a": 2}
    index.apply_events("a", [BlockRemoved(block_hashes=[Hash(5)], medium="GPU")])
    assert index.num_blocks("a") == 1 and index.stats["removals_unknown"] == 0
    assert index.longest_prefix([5]) == {"a": 0} and index.longest_prefix([6]) == {"a": 1}


def test_each_event_is_read_once(KVIndex):
    # The pure twin read block_hashes and medium again to apply them after checking them: an
    # event whose fields change between reads (a subclass's properties) got applied unchecked.
    class Shifty(BlockStored):
        reads = 0

        @property
        def block_hashes(self):
            Shifty.reads += 1
            return [1, 2] if Shifty.reads == 1 else [-1]

    event = Shifty(block_hashes=[], parent_block_hash=None, token_ids=[], block_size=16, lora_id=None,
                   medium="GPU", lora_name=None)
    index = KVIndex()
    index.apply_events("a", [event])
    assert Shifty.reads == 1
    assert index.longest_prefix([1, 2]) == {"a": 2}


def test_events_list_shrunk_while_checked_does_not_crash(KVIndex):
    """A hash list's ``__iter__`` (Python code run while the events are checked) empties the
    events list: the index reads a snapshot, never past the list's new end (a crash once), and
    both twins apply every event they were given."""
    import os
    import subprocess

    code = f"""
from {KVIndex.__module__} import KVIndex
from kvcy.kv_events import BlockStored
events = []
class Emptier(list):
    def __iter__(self):
        events.clear()
        return iter(list.__iter__(self))
def ev(h):
    return BlockStored(block_hashes=h, parent_block_hash=None, token_ids=[], block_size=16,
                       lora_id=None, medium=None, lora_name=None)
events.extend([ev(Emptier([1, 2]))] + [ev([k]) for k in range(3, 3000)])
index = KVIndex()
print(index.apply_events("a", events), index.num_blocks("a"), index.longest_prefix([1, 2]))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "2998 2999 {'a': 2}"


def test_pure_twin_checks_plain_hashes_inline(monkeypatch):
    """The pure twin's hot path: plain hashes (an int in range, bytes) are checked inline, with
    no call and no message built per hash; any other hash still gets its indexed message."""
    from kvcy._fast import _kv_index_py

    calls = []
    check = _kv_index_py._check_hash
    monkeypatch.setattr(_kv_index_py, "_check_hash", lambda h, where: calls.append(where) or check(h, where))
    index = _kv_index_py.KVIndex()
    hashes = [0, 1, 2**64 - 1, b"x" * 32, 7]
    assert index.apply_events("a", [stored(hashes)]) == 1
    assert index.longest_prefix(hashes) == {"a": 5}
    assert calls == []
    with pytest.raises(ValueError, match=r"^block_hashes\[2\]: block hash -1 is not an unsigned 64-bit int$"):
        index.longest_prefix([1, 2, -1])
    with pytest.raises(TypeError, match=r"^events\[0\]\.block_hashes\[1\]: a block hash is an int or bytes, got bool$"):
        index.apply_events("a", [stored([1, True])])
    assert calls
    assert index.stats["events_applied"] == 1


def test_an_index_is_bounded_by_default(KVIndex):
    """One batch of millions of hashes took an unbounded ``KVIndex()`` to gigabytes: by default
    it holds 2**20 entries (the least recently stored go first, counted), unless told otherwise."""
    index = KVIndex()
    assert index.max_blocks == 1 << 20 and KVIndex(None).max_blocks is None
    flood = BlockStored(block_hashes=list(range((1 << 20) + 5)), parent_block_hash=None, token_ids=[],
                        block_size=16, lora_id=None, medium="GPU", lora_name=None)
    index.apply_events("a", [flood])
    assert (index.num_blocks(), index.stats["entries_dropped"]) == (1 << 20, 5)
    assert index.longest_prefix([5, 6]) == {"a": 2} and index.longest_prefix([4]) == {"a": 0}
