"""Issue 16: what Python can do to the twins' public state must not crash, corrupt or leak.

Every test runs against both twins (the ``impl`` fixture).  A check that could
crash the interpreter runs in a subprocess, and a signal counts as a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

BS = 4
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def hasher(bs=BS):
    return get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))


def full_config(num_blocks=64, bs=BS):
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])


def hybrid_config(num_blocks=64, bs=BS):
    full = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    swa = SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["l0"], full), KVCacheGroupSpec(["l1"], swa)])


def manager(impl, num_blocks=64, config=None, **kw):
    kw.setdefault("max_model_len", 256)
    return impl.kv_cache.KVCacheManager(config or full_config(num_blocks), scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def ids(blocks):
    return [b.block_id for b in blocks]


def snapshot(mgr):
    """Everything observable about a manager's blocks: free count, queue order, block tables,
    reference counts and cache keys."""
    pool = mgr.block_pool
    tables = tuple(
        {rid: ids(blocks) for rid, blocks in m.req_to_blocks.items()}
        for m in mgr.coordinator.single_type_managers
    )
    cached = tuple(dict(m.num_cached_block) for m in mgr.coordinator.single_type_managers)
    return (
        pool.get_num_free_blocks(),
        ids(pool.free_block_queue.get_all_free_blocks()),
        tables,
        cached,
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
    )


def run_isolated(impl, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter with the twin's module as ``m`` (a crash kills only
    that interpreter); the caller checks the return code (negative: killed by a signal)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    prelude = textwrap.dedent(
        f"""
        from kvcy import _fast
        from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
        from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        m = _fast.load({impl.name!r})["kv_cache"]
        init_none_hash(get_hash_fn_by_name("sha256"))
        hasher = get_request_block_hasher({BS}, get_hash_fn_by_name("sha256"))
        spec = FullAttentionSpec(block_size={BS}, num_kv_heads=1, head_size=8, dtype="float16")
        config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        """
    )
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_clean_exit(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit status {proc.returncode} (a negative one: killed by that signal)\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


# --------------------------------------------------------------------------- item 3
def test_a_queued_block_cannot_take_references(impl):
    """A free block whose public ref_cnt was raised used to be queued a second time when it
    was freed (the compiled twin then handed it out twice: [1, 1, 2, 3] from a 3-block pool).
    A queued block's count now stays 0: the assignment is refused, and nothing changes."""
    pool = impl.kv_cache.BlockPool(5, enable_caching=True, hash_block_size=BS)
    held = pool.get_new_blocks(1)[0]
    queue_before = ids(pool.free_block_queue.get_all_free_blocks())
    for block in (pool.blocks[2], pool.free_block_queue.fake_free_list_head):
        with pytest.raises(RuntimeError, match="is in a free queue"):
            block.ref_cnt = 1
        assert block.ref_cnt == 0
    held.ref_cnt = 2  # a held block's count may be moved
    held.ref_cnt = 1
    assert ids(pool.free_block_queue.get_all_free_blocks()) == queue_before
    pool.free_blocks([held])
    got = ids(pool.get_new_blocks(pool.get_num_free_blocks()))
    assert sorted(got) == [1, 2, 3, 4]  # each block once


def test_a_block_queued_in_another_pool_cannot_take_references(impl):
    pool_a = impl.kv_cache.BlockPool(4, enable_caching=True, hash_block_size=BS)
    pool_b = impl.kv_cache.BlockPool(4, enable_caching=True, hash_block_size=BS)
    stray = pool_b.blocks[2]  # free, in pool_b's queue
    with pytest.raises(RuntimeError, match="is in a free queue"):
        stray.ref_cnt = 1
    with pytest.raises(RuntimeError, match="already in the free queue"):
        pool_a.free_block_queue.append(stray)
    assert ids(pool_a.free_block_queue.get_all_free_blocks()) == [1, 2, 3]
    assert ids(pool_b.free_block_queue.get_all_free_blocks()) == [1, 2, 3]


@pytest.mark.parametrize("how", ["append", "append_n", "prepend_n"])
def test_only_free_blocks_are_queued(impl, how):
    """The other way in: a held block put in the queue by hand would be queued again when it
    is freed.  Refused, nothing changes."""
    pool = impl.kv_cache.BlockPool(5, enable_caching=True, hash_block_size=BS)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a])  # a is free again, b is held
    a = pool.get_new_blocks(1)[0]
    a.ref_cnt = 0  # (held, its count dropped by hand: free to queue)
    queue = pool.free_block_queue
    before = (queue.num_free_blocks, ids(queue.get_all_free_blocks()))
    with pytest.raises(RuntimeError, match=f"block {b.block_id} has ref_cnt 1: only free blocks are queued"):
        if how == "append":
            queue.append(b)
        else:
            getattr(queue, how)([a, b])
    assert (queue.num_free_blocks, ids(queue.get_all_free_blocks())) == before
    pool.free_blocks([b])
    assert sorted(ids(pool.get_new_blocks(pool.get_num_free_blocks()))) == sorted(
        {1, 2, 3, 4} - {a.block_id})


# --------------------------------------------------------------------------- item 6
def _tamper(req, how, index=5):
    if how == "not bytes":
        req.block_hashes[index] = 12345
    elif how == "removed":
        del req.block_hashes[index + 1:]
    elif how == "None":
        req.block_hashes[index] = None


# (Hashes removed are not an error: as in vLLM, only the blocks with hashes are cached --
# with hash lookahead the hashes lag behind the tokens; tests/test_dropin_api.py.)
TAMPERINGS = {"not bytes": TypeError, "None": TypeError}


@pytest.mark.parametrize("how", list(TAMPERINGS))
@pytest.mark.parametrize("layout", ["full", "hybrid"])
def test_tampered_hashes_are_refused_before_allocating(impl, how, layout):
    """Caching runs after allocating: a request whose hashes it cannot read must be refused
    before anything is taken (it used to leave 13 blocks held)."""
    mgr = manager(impl, config=hybrid_config() if layout == "hybrid" else None)
    other = impl.kv_cache.Request("other", list(range(100, 118)), block_hasher=hasher())
    mgr.allocate_slots(other, other.num_tokens)
    req = impl.kv_cache.Request("a", list(range(50)), block_hasher=hasher())
    _tamper(req, how)
    before = snapshot(mgr)
    with pytest.raises(TAMPERINGS[how]):
        mgr.allocate_slots(req, 50)
    assert snapshot(mgr) == before
    assert not mgr.coordinator.holds("a")


@pytest.mark.parametrize("how", list(TAMPERINGS))
def test_tampered_hashes_of_a_running_request(impl, how):
    """The same on a later step of a running request (the compiled decode path) and with prefix
    hits handed in: nothing is touched, allocated or recorded."""
    mgr = manager(impl)
    warm = impl.kv_cache.Request("warm", list(range(40)), block_hasher=hasher())
    mgr.allocate_slots(warm, warm.num_tokens)
    mgr.free(warm)
    req = impl.kv_cache.Request("a", list(range(50)), block_hasher=hasher())
    hits, n_hit, _ = mgr.get_computed_blocks(req)
    assert n_hit == 40
    _tamper(req, how, index=10)  # (the hits' hashes are not read again: the new blocks' are)
    before = snapshot(mgr)
    with pytest.raises(TAMPERINGS[how]):
        mgr.allocate_slots(req, 10, num_new_computed_tokens=n_hit, new_computed_blocks=hits)
    assert snapshot(mgr) == before
    # A running request: 8 tokens cached, then its hashes go bad before the next block fills.
    run = impl.kv_cache.Request("b", list(range(200, 208)), block_hasher=hasher())
    mgr.allocate_slots(run, 8)
    run.num_computed_tokens = 8
    run.append_output_token_ids([1, 2, 3, 4])
    run.block_hashes[2] = "x"
    before = snapshot(mgr)
    with pytest.raises(TypeError, match="block hashes must be bytes, got str"):
        mgr.allocate_slots(run, 4)
    assert snapshot(mgr) == before
    run.block_hashes[2] = b"y" * 32
    assert mgr.allocate_slots(run, 4) is not None


def test_wrong_length_digests_still_cache(impl):
    """A digest of another length is still a cache key (nothing reads its length): accepted."""
    mgr = manager(impl)
    req = impl.kv_cache.Request("a", list(range(8)), block_hasher=hasher())
    req.block_hashes[1] = b"xx"
    mgr.allocate_slots(req, 8)
    assert mgr.block_pool.blocks[2].block_hash == b"xx" + (0).to_bytes(4, "big")


# --------------------------------------------------------------------------- item 5
@pytest.mark.parametrize("held", [False, True], ids=["free hits", "held hits"])
def test_hits_from_another_manager_are_refused(impl, held):
    """Prefix hits looked up in one manager and handed to another: a clear error, both managers
    unchanged (the Python twin used to take them, listing block 1 twice and corrupting both
    pools; both twins took another pool's held blocks)."""
    m1, m2 = manager(impl), manager(impl)
    warm = impl.kv_cache.Request("w", list(range(20)), block_hasher=hasher())
    m2.allocate_slots(warm, 20)
    if not held:
        m2.free(warm)
    req = impl.kv_cache.Request("r", list(range(20)), block_hasher=hasher())
    hits, n_hit, _ = m2.get_computed_blocks(req)
    assert n_hit == 16
    before1, before2 = snapshot(m1), snapshot(m2)
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        m1.allocate_slots(req, 4, num_new_computed_tokens=n_hit, new_computed_blocks=hits)
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        m1.block_pool.touch(hits.blocks[0])
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        m1.coordinator.allocate_new_computed_blocks("r", hits.blocks, n_hit, 0)
    assert snapshot(m1) == before1 and snapshot(m2) == before2
    # Its own hits are fine.
    assert m2.allocate_slots(req, 4, num_new_computed_tokens=n_hit, new_computed_blocks=hits) is not None


def test_queue_remove_of_another_queues_block_is_refused(impl):
    m = impl.kv_cache
    q1 = m.FreeKVCacheBlockQueue([m.KVCacheBlock(i) for i in range(3)])
    other = [m.KVCacheBlock(i) for i in range(3)]
    q2 = m.FreeKVCacheBlockQueue(other)
    with pytest.raises(RuntimeError, match="remove\\(\\) called on an invalid block"):
        q1.remove(other[1])
    assert (q1.num_free_blocks, ids(q1.get_all_free_blocks())) == (3, [0, 1, 2])
    assert (q2.num_free_blocks, ids(q2.get_all_free_blocks())) == (3, [0, 1, 2])
    q2.remove(other[1])
    assert ids(q2.get_all_free_blocks()) == [0, 2]


# --------------------------------------------------------------------------- item 1
CRASHERS = {
    # What used to kill the compiled twin (SIGSEGV / SIGFPE) from plain Python.
    "free_block_queue = None, then free": """
        mgr = m.KVCacheManager(config, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
        r = m.Request("r", list(range(10)), block_hasher=hasher)
        mgr.allocate_slots(r, 10)
        try:
            mgr.block_pool.free_block_queue = None
        except AttributeError:
            pass
        mgr.free(r)
    """,
    "cached_block_hash_to_block = None, then get_computed_blocks": """
        mgr = m.KVCacheManager(config, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
        try:
            mgr.block_pool.cached_block_hash_to_block = None
        except AttributeError:
            pass
        mgr.get_computed_blocks(m.Request("r", list(range(10)), block_hasher=hasher))
    """,
    "manager.block_pool = None, then free": """
        mgr = m.KVCacheManager(config, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
        r = m.Request("r", list(range(10)), block_hasher=hasher)
        mgr.allocate_slots(r, 10)
        try:
            mgr.coordinator.single_type_managers[0].block_pool = None
        except AttributeError:
            pass
        mgr.free(r)
    """,
    "coordinator.retention_interval = huge or odd, then allocate and cache": """
        from kvcy.kv_cache_interface import SlidingWindowSpec
        cfg = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")),
            KVCacheGroupSpec(["s"], SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                                      sliding_window=8))])
        mgr = m.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
        for value in (2**62, 2**63, -4, 3, 4, 0, None, "x", 1.5):
            try:
                mgr.coordinator.retention_interval = value
            except (TypeError, ValueError):
                pass
            r = m.Request(f"r{value}", list(range(40)), block_hasher=hasher)
            r.shared_prefix_boundary = 12
            mgr.allocate_slots(r, 40)
            r.num_computed_tokens = 40
            mgr.free(r)
    """,
    "manager.block_size = 0, then allocate_slots": """
        mgr = m.KVCacheManager(config, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
        try:
            mgr.coordinator.single_type_managers[0].block_size = 0
        except AttributeError:
            pass
        mgr.allocate_slots(m.Request("r", list(range(10)), block_hasher=hasher), 10)
    """,
}


@pytest.mark.parametrize("case", list(CRASHERS))
def test_assigning_internals_cannot_crash(impl, case):
    assert_clean_exit(run_isolated(impl, textwrap.dedent(CRASHERS[case]) + "print('survived')\n"))


def _objects(impl):
    """One of each object whose attributes a user can reach, by a name for the tables below."""
    mod = impl.kv_cache
    mgr = manager(impl)
    hybrid = manager(impl, config=hybrid_config())
    no_cache = manager(impl, enable_caching=False)
    req = mod.Request("r", list(range(10)), block_hasher=hasher())
    mgr.allocate_slots(req, 10)
    stms = hybrid.coordinator.single_type_managers
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

    mamba_cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")),
        KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                          mamba_cache_mode="align"))])
    mamba = mod.KVCacheManager(mamba_cfg, 256, 16, 4).coordinator.single_type_managers[1]
    from kvcy.kv_cache_interface import CircularBufferSpec, RSWASpec

    attn = {"block_size": 4, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    local_cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], FullAttentionSpec(**attn)), KVCacheGroupSpec(["r"], RSWASpec(**attn, rswa_window=8))])
    rswa = mod.KVCacheManager(local_cfg, 256, 4, 4).coordinator.single_type_managers[1]
    ring_cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["c"], CircularBufferSpec(**attn))])
    ring = mod.KVCacheManager(ring_cfg, 256, 4, 4).coordinator.single_type_managers[0]
    return {
        "request": req,
        "block": mgr.block_pool.blocks[1],
        "queue": mgr.block_pool.free_block_queue,
        "pool": mgr.block_pool,
        "full_manager": mgr.coordinator.single_type_managers[0],
        "sliding_manager": stms[1],
        "mamba_manager": mamba,
        "rswa_manager": rswa,
        "ring_manager": ring,
        "unitary": mgr.coordinator,
        "hybrid": hybrid.coordinator,
        "no_cache": no_cache.coordinator,
        "kv_cache_blocks": mgr.get_blocks("r"),
        "manager": mgr,
    }


# Attributes a user may assign (what vLLM's scheduler and tests assign, and free-form fields);
# every other data attribute the compiled twin exposes is read-only in both twins.
ASSIGNABLE = {
    "request": {"num_computed_tokens", "status", "block_hashes", "num_in_flight_tokens", "max_tokens",
                "arrival_time", "skip_reading_prefix_cache", "num_preemptions", "spec_token_ids",
                "shared_prefix_boundary"},
    "block": {"ref_cnt", "block_hash_num_tokens", "block_hash"},  # (block_hash: vLLM's setter, asserts)
    "queue": {"num_free_blocks"},
    "pool": {"metrics_collector", "num_evictions"},
    "full_manager": {"use_eagle", "cache_hit_alignment_tokens", "shared_prefix_checkpoint"},
    "sliding_manager": {"use_eagle", "cache_hit_alignment_tokens", "shared_prefix_checkpoint"},
    "mamba_manager": {"use_eagle", "cache_hit_alignment_tokens", "shared_prefix_checkpoint",
                      "drop_eagle_checkpoint_block"},
    "rswa_manager": {"use_eagle", "cache_hit_alignment_tokens", "shared_prefix_checkpoint"},
    "ring_manager": {"use_eagle", "cache_hit_alignment_tokens", "shared_prefix_checkpoint"},
    "unitary": {"retention_interval"},  # (vLLM's tests set it on a live coordinator; checked)
    "hybrid": {"retention_interval"},
    "no_cache": {"retention_interval"},
    "kv_cache_blocks": {"blocks"},
    "manager": {"metrics_collector", "prefix_cache_stats", "watermark_blocks", "refuse_unservable", "refuse_stale_hits"},
}


def _data_attributes(obj):
    """The compiled twin's data attributes of ``obj``'s class (C fields and properties)."""
    import inspect

    names = set()
    for klass in type(obj).__mro__:
        for name, value in vars(klass).items():
            if inspect.isgetsetdescriptor(value) or inspect.ismemberdescriptor(value) or isinstance(value, property):
                if not name.startswith("__"):
                    names.add(name)
    return names


def test_every_compiled_attribute_is_read_only_or_checked():
    """Every data attribute of every compiled class is either read-only or in ASSIGNABLE (whose
    assignments are typed and checked); a new ``cdef public`` field fails here until it is
    decided."""
    from kvcy import _fast

    if "cython" not in _fast.available() or _fast.NO_EXTENSIONS:
        pytest.skip("compiled twins not in use")
    from types import SimpleNamespace

    impl = SimpleNamespace(name="cython", **_fast.load("cython"))
    for kind, obj in _objects(impl).items():
        for name in sorted(_data_attributes(obj)):
            value = getattr(obj, name)
            try:
                setattr(obj, name, value)
            except AttributeError:
                assert name not in ASSIGNABLE[kind], f"{kind}.{name} should be assignable"
            except AssertionError:  # (a setter that refuses this value: assignable, checked)
                assert name in ASSIGNABLE[kind], f"{kind}.{name} is assignable but not audited"
            else:
                assert name in ASSIGNABLE[kind], f"{kind}.{name} is assignable but not audited"


def test_both_twins_refuse_the_same_assignments(impl):
    """Read-only in one twin is read-only in the other (AttributeError); what is assignable
    takes its own value back in both."""
    from kvcy import _fast

    if "cython" not in _fast.available() or _fast.NO_EXTENSIONS:
        pytest.skip("needs the compiled twin as the reference")
    from types import SimpleNamespace

    compiled = _objects(SimpleNamespace(name="cython", **_fast.load("cython")))
    for kind, obj in _objects(impl).items():
        for name in sorted(_data_attributes(compiled[kind])):
            if not hasattr(obj, name):
                continue
            value = getattr(obj, name)
            if name == "block_hash":
                continue  # (vLLM's assert-guarded setter, the same code in both twins)
            if name in ASSIGNABLE[kind]:
                setattr(obj, name, value)
            else:
                with pytest.raises(AttributeError):
                    setattr(obj, name, value)
                with pytest.raises(AttributeError):
                    delattr(obj, name)


BAD_ASSIGNMENTS = [
    ("block", "ref_cnt", -1, ValueError),
    ("block", "ref_cnt", 2**31, ValueError),
    ("block", "ref_cnt", "1", TypeError),
    ("block", "ref_cnt", True, TypeError),
    ("block", "block_hash_num_tokens", -4, ValueError),
    ("block", "block_hash_num_tokens", 4.0, TypeError),
    ("request", "num_computed_tokens", -1, ValueError),
    ("request", "num_computed_tokens", 1.5, TypeError),
    ("request", "num_in_flight_tokens", -1, ValueError),
    ("request", "num_preemptions", -1, ValueError),
    ("request", "spec_token_ids", ["a"], TypeError),
    ("request", "spec_token_ids", [2**64], ValueError),
    ("request", "block_hashes", None, TypeError),
    ("request", "block_hashes", (b"x",), TypeError),
    ("request", "block_hashes", [b"x", 3], TypeError),
    ("queue", "num_free_blocks", "3", TypeError),
    ("queue", "num_free_blocks", 2**64, OverflowError),
    ("pool", "num_evictions", 1.5, TypeError),
    ("full_manager", "cache_hit_alignment_tokens", 0, ValueError),
    ("full_manager", "cache_hit_alignment_tokens", "16", TypeError),
    ("mamba_manager", "cache_hit_alignment_tokens", -4, ValueError),
    ("kv_cache_blocks", "blocks", [[]], TypeError),
    ("manager", "watermark_blocks", None, TypeError),
    # retention_interval: the config's check (an int or None; >= 0, a multiple of the scheduler
    # block; only 0 without a sliding-window or Mamba group; at most 2**62)
    ("unitary", "retention_interval", "0", TypeError),
    ("unitary", "retention_interval", True, TypeError),
    ("unitary", "retention_interval", 8, ValueError),
    ("hybrid", "retention_interval", -BS, ValueError),
    ("hybrid", "retention_interval", BS + 1, ValueError),
    ("hybrid", "retention_interval", 2**70 * BS, ValueError),
    ("hybrid", "retention_interval", 0.0, TypeError),
]


@pytest.mark.parametrize("kind, name, value, error", BAD_ASSIGNMENTS,
                         ids=[f"{k}.{n}={v!r}" for k, n, v, _ in BAD_ASSIGNMENTS])
def test_bad_values_are_refused_alike(impl, kind, name, value, error):
    obj = _objects(impl)[kind]
    before = getattr(obj, name)
    with pytest.raises(error):
        setattr(obj, name, value)
    assert getattr(obj, name) == before


def test_checked_assignments_still_work(impl):
    objs = _objects(impl)
    req, block = objs["request"], objs["block"]
    req.num_computed_tokens = 10
    req.spec_token_ids = [1, 2]
    req.block_hashes = list(req.block_hashes)
    req.num_preemptions += 1
    assert (req.num_computed_tokens, req.spec_token_ids, req.num_preemptions) == (10, [1, 2], 1)
    block.ref_cnt = block.ref_cnt + 1
    block.ref_cnt -= 1
    req.extra_field = "free"  # other attributes stay free, as on vLLM's Request
    assert req.extra_field == "free"


def test_retention_interval_assigned_on_a_live_coordinator_acts_as_the_configs(impl):
    """``coordinator.retention_interval = 0`` (as vLLM's tests set it) caches what a manager
    built with ``prefix_cache_retention_interval=0`` caches; deleting it is refused."""
    import dataclasses

    def run(mgr):
        req = impl.kv_cache.Request("r", list(range(6 * BS + 1)), block_hasher=hasher())
        req.shared_prefix_boundary = 2 * BS
        mgr.allocate_slots(req, 6 * BS + 1)
        req.num_computed_tokens = 6 * BS + 1
        mgr.free(req)
        return snapshot(mgr)

    configured = manager(impl, config=dataclasses.replace(hybrid_config(), prefix_cache_retention_interval=0))
    assigned = manager(impl, config=hybrid_config())
    assigned.coordinator.retention_interval = 0
    assert assigned.coordinator.retention_interval == 0
    expected = run(configured)
    assert run(assigned) == expected
    assert run(manager(impl, config=hybrid_config())) != expected  # (dense retention caches more)
    assigned.coordinator.retention_interval = None
    assert assigned.coordinator.retention_interval is None
    with pytest.raises(AttributeError):
        del assigned.coordinator.retention_interval
    assert assigned.coordinator.retention_interval is None


@pytest.mark.parametrize("name", ["retains_longer_hit", "supports_fine_grained_hash_lookup"])
def test_manager_class_constants_cannot_be_shadowed(impl, name):
    """A manager type's constants (read from the instance by the manager and the hybrid
    lookup) cannot be overridden on one instance: the compiled twin's instances have no
    ``__dict__``; the pure twin refuses the same way (AttributeError, value unchanged)."""
    objs = _objects(impl)
    for kind in ("full_manager", "sliding_manager", "mamba_manager", "rswa_manager", "ring_manager"):
        obj = objs[kind]
        before = getattr(obj, name)
        with pytest.raises(AttributeError):
            setattr(obj, name, not before)
        with pytest.raises(AttributeError):
            delattr(obj, name)
        assert getattr(obj, name) is before


@pytest.mark.parametrize("value, flag", [("x", True), (None, False), (0, False), (3, True), ([], False)])
def test_manager_flags_read_back_as_bools(impl, value, flag):
    """``use_eagle`` (like the other flags) is a C ``bint`` in the compiled twin: whatever is
    assigned reads back as a bool, the same in both twins."""
    objs = _objects(impl)
    for kind in ("full_manager", "sliding_manager", "mamba_manager", "rswa_manager", "ring_manager"):
        for name in ("use_eagle", "shared_prefix_checkpoint"):
            setattr(objs[kind], name, value)
            got = getattr(objs[kind], name)
            assert got is flag, f"{kind}.{name} = {value!r} read back {got!r}"


# --------------------------------------------------------------------------- item 2
def test_request_tables_changed_by_hand_are_followed(impl):
    """A decode step after a request's entry was popped and its blocks freed by hand must see
    the tables as they are (the compiled twin's per-request record used to go stale: it
    extended the orphaned list, which still held two freed blocks, and leaked the new block)."""
    mgr = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    req = impl.kv_cache.Request("r", list(range(8)), block_hasher=hasher())
    mgr.allocate_slots(req, 8)
    req.num_computed_tokens = 8
    req.append_output_token_ids([1])
    mgr.allocate_slots(req, 1)  # a decode step: the record is made here
    req.append_output_token_ids([2])
    blocks = single.req_to_blocks.pop("r")
    single.num_cached_block.pop("r")
    mgr.block_pool.free_blocks(reversed(blocks))
    free_before = mgr.block_pool.get_num_free_blocks()
    new = mgr.allocate_slots(req, 1)
    held = single.req_to_blocks["r"]
    assert ids(new.blocks[0]) == ids(held)  # every block it holds is new (nothing freed kept)
    assert all(b.ref_cnt == 1 for b in held)
    assert mgr.block_pool.get_num_free_blocks() == free_before - len(held)
    mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == mgr.block_pool.num_gpu_blocks - 1  # nothing leaked


def test_request_table_entries_set_by_hand_are_followed(impl):
    """The same for an entry replaced or a cached count lowered by hand between steps."""
    mgr = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    req = impl.kv_cache.Request("r", list(range(8)), block_hasher=hasher())
    mgr.allocate_slots(req, 8)
    req.num_computed_tokens = 8
    req.append_output_token_ids([1])
    mgr.allocate_slots(req, 1)
    req.append_output_token_ids([2])
    blocks = single.req_to_blocks["r"]
    single.req_to_blocks["r"] = blocks[:2]  # hand the third block back
    mgr.block_pool.free_blocks([blocks[2]])
    mgr.allocate_slots(req, 1)
    assert len(single.req_to_blocks["r"]) == 3
    assert all(b.ref_cnt == 1 for b in single.req_to_blocks["r"])
    mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == mgr.block_pool.num_gpu_blocks - 1


# --------------------------------------------------------------------------- item 4
def test_a_dead_pool_gives_its_memory_back(impl):
    """Building a manager of 10^6 blocks, using it and deleting it brings RSS back to within
    10 % of where it was (the compiled twin's slab allocator kept every block's memory: RSS
    went from 25 to 118 MiB and back to only 86)."""
    body = """
        import gc, os, random

        def rss_mib():
            with open(f"/proc/{os.getpid()}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

        def use(num_blocks):
            cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
            mgr = m.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=4, hash_block_size=4)
            rng = random.Random(num_blocks)
            for i in range(200):
                req = m.Request(f"r{i}", [rng.randrange(1000) for _ in range(400)], block_hasher=hasher)
                mgr.allocate_slots(req, req.num_tokens)
                if i % 2:
                    mgr.free(req)
            return mgr, rss_mib()

        # A process that has used kvcy already (its one-time growth -- interpreter
        # caches, the C allocator's thresholds -- happens here, not in the figure).
        use(100_000)
        gc.collect()
        try:
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        before = rss_mib()
        mgr, peak = use(1_000_000)
        del mgr
        gc.collect()
        try:  # (hand glibc's free pages back too: what is measured is what kvcy still holds)
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        after = rss_mib()
        print(f"rss before {before:.1f} MiB, with the pool {peak:.1f}, after {after:.1f}")
        assert peak - before > 60, (before, peak)  # (the pool was big enough to tell)
        assert after <= before * 1.10, (before, peak, after)
    """
    assert_clean_exit(run_isolated(impl, body))


def test_blocks_are_seen_by_tracemalloc(impl):
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        blocks = [impl.kv_cache.KVCacheBlock(i) for i in range(20_000)]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown >= 20_000 * 48, grown  # (each block's object, not just the list)
    del blocks


def test_cycles_through_the_queue_and_the_map_are_collected(impl):
    """A block subclass whose instance refers back to the queue (or map) holding it forms a
    cycle; the collector must see the queue's and map's references to find it."""
    import gc
    import weakref

    mod = impl.kv_cache

    class Tagged(mod.KVCacheBlock):
        pass

    class Token:
        pass

    gc.collect()
    block = Tagged(7)
    queue = mod.FreeKVCacheBlockQueue([block])
    block.owner, block.token = queue, Token()
    queue_token = weakref.ref(block.token)
    cache = mod.BlockHashToBlockMap()
    other = Tagged(8)
    cache.insert(b"h" * 32 + (0).to_bytes(4, "big"), other)
    other.owner, other.token = cache, Token()
    cache_token = weakref.ref(other.token)
    del block, queue, other, cache
    gc.collect()
    assert queue_token() is None  # the cycle block -> queue -> ring -> block was found
    assert cache_token() is None  # ... and block -> map -> table -> block


# --------------------------------------------------------------------------- lists callers can reach
# req_to_blocks hands out the manager's own lists and KVCacheBlocks.blocks is
# public: a non-block put there must be refused alike, never read as a block
# (the compiled twin read a None's or a bytes' memory as a block id).
@pytest.mark.parametrize("bad", [None, b"x" * 100, 7])
def test_a_non_block_in_a_held_list_is_refused_when_zeroing(impl, bad):
    from kvcy.kv_cache_interface import MambaSpec

    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    mamba = MambaSpec(block_size=BS, shapes=((2,),), dtypes=("float32",))
    config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["l0"], full), KVCacheGroupSpec(["l1"], mamba)])
    # (caching off: vLLM 0.33.0 caches a Mamba group only in Mamba align mode)
    mgr = impl.kv_cache.KVCacheManager(config, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                       enable_caching=False)
    assert config.needs_kv_cache_zeroing
    mgr.allocate_slots(impl.kv_cache.Request("a", list(range(12)), block_hasher=hasher()), 12)
    before = mgr.take_new_block_ids()
    assert before
    mgr.coordinator.single_type_managers[0].req_to_blocks["a"].append(bad)
    with pytest.raises(TypeError, match=f"req_to_blocks values must be lists of blocks, got a list holding "
                                        f"{type(bad).__name__}"):
        mgr.record_blocks_for_zeroing("a", 0)
    assert mgr.take_new_block_ids() == []  # refused before any group recorded anything
    mgr.coordinator.single_type_managers[0].req_to_blocks["a"].pop()
    mgr.record_blocks_for_zeroing("a", 0)
    assert sorted(mgr.take_new_block_ids()) == sorted(before)


@pytest.mark.parametrize("bad", [None, b"x" * 100, 7])
def test_a_non_block_in_kv_cache_blocks_is_refused_alike(impl, bad):
    pool = impl.kv_cache.BlockPool(4, True, BS)
    blocks = impl.kv_cache.KVCacheBlocks(([pool.blocks[1], bad],))
    with pytest.raises(TypeError, match=f"blocks must be KVCacheBlock, got {type(bad).__name__}"):
        blocks.get_block_ids()
    with pytest.raises(TypeError, match=f"blocks must be KVCacheBlock, got {type(bad).__name__}"):
        repr(blocks)
    assert impl.kv_cache.KVCacheBlocks(([pool.blocks[1]],)).get_block_ids() == ([1],)


@pytest.mark.parametrize("ids, error, message", [
    (["x"], TypeError, "kv_cache_group_ids must be ints, got str"),
    ([0, None], TypeError, "kv_cache_group_ids must be ints, got NoneType"),
    ([1.0], TypeError, "kv_cache_group_ids must be ints, got float"),
    ([-1], ValueError, "KV-cache group id -1 does not fit in 4 bytes"),
    ([2**33], ValueError, "KV-cache group id 8589934592 does not fit in 4 bytes"),
])
@pytest.mark.parametrize("kind", ["FullAttentionManager", "SlidingWindowManager"])
def test_bad_group_ids_in_a_hit_search_are_refused_alike(impl, kind, ids, error, message):
    # (the twins raised different errors: the compiled one TypeError/ValueError from
    # its conversions, the Python one AttributeError/OverflowError)
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    spec = full if kind == "FullAttentionManager" else swa
    pool = impl.kv_cache.BlockPool(16, True, BS)
    req = impl.kv_cache.Request("a", list(range(20)), block_hasher=hasher())
    pool.cache_full_blocks(req, pool.get_new_blocks(2), 0, 2, BS, 0)
    cls = getattr(impl.kv_cache, kind)
    with pytest.raises(error, match=message):
        cls.find_longest_cache_hit(req.block_hashes, 20, ids, pool, spec, False, BS)
    assert cls.find_longest_cache_hit(req.block_hashes, 20, [0], pool, spec, False, BS)[1] == 8


@pytest.mark.parametrize("mode", ["none", "align"])
def test_num_speculative_blocks_too_large_to_compute_with_is_refused(impl, mode):
    """A Mamba spec asking 2**59 speculative blocks a request: the compiled twin's
    ``block_size * num_speculative_blocks`` wrapped in C and it handed out blocks the pure
    twin (and vLLM) refuse; both twins now refuse the manager (ValueError) when it is made."""
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")),
        KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                          mamba_cache_mode=mode, num_speculative_blocks=2**59))])
    with pytest.raises(ValueError, match=r"num_speculative_blocks must be below 2\*\*31, got 576460752303423488"):
        impl.kv_cache.KVCacheManager(cfg, 4096, 16, 16, enable_caching=mode == "align")
    ok = MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",), mamba_cache_mode=mode,
                   num_speculative_blocks=2**31 - 1)
    mgr = impl.kv_cache.KVCacheManager(KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        cfg.kv_cache_groups[0], KVCacheGroupSpec(["m"], ok)]), 4096, 16, 16, enable_caching=mode == "align")
    req = impl.kv_cache.Request("r", list(range(40)), block_hasher=hasher(16))
    with pytest.raises(ValueError, match="can never be scheduled"):  # (more blocks than the pool has)
        mgr.allocate_slots(req, 40)
    mgr.refuse_unservable = False
    assert mgr.allocate_slots(req, 40) is None  # (as in vLLM)

