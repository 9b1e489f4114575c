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
        f"exit {proc.returncode} (negative: killed by signal {-proc.returncode})\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


# --------------------------------------------------------------------------- item 3
def test_freeing_a_queued_block_is_refused(impl):
    """A free block whose public ref_cnt was raised must not be queued a second time (the
    compiled twin used to, then handed the block out twice: [1, 1, 2, 3] from a 3-block pool)."""
    pool = impl.kv_cache.BlockPool(5, enable_caching=True, hash_block_size=BS)
    other = pool.get_new_blocks(1)[0]  # block 1, held: freed in the same batch, rolled back too
    b = pool.blocks[2]
    b.ref_cnt = 1
    queue_before = ids(pool.free_block_queue.get_all_free_blocks())
    with pytest.raises(RuntimeError, match="block 2 is already in the free queue"):
        pool.free_blocks([other, b])
    assert b.ref_cnt == 1 and other.ref_cnt == 1
    assert ids(pool.free_block_queue.get_all_free_blocks()) == queue_before
    assert pool.get_num_free_blocks() == len(queue_before)
    b.ref_cnt = 0
    pool.free_blocks([other])
    got = ids(pool.get_new_blocks(pool.get_num_free_blocks()))
    assert sorted(got) == [1, 2, 3, 4]


def test_freeing_a_block_queued_in_another_pool_is_refused(impl):
    pool_a = impl.kv_cache.BlockPool(4, enable_caching=True, hash_block_size=BS)
    pool_b = impl.kv_cache.BlockPool(4, enable_caching=True, hash_block_size=BS)
    stray = pool_b.blocks[2]  # free, in pool_b's queue
    stray.ref_cnt = 1
    with pytest.raises(RuntimeError, match="already in the free queue"):
        pool_a.free_blocks([stray])
    assert stray.ref_cnt == 1
    assert ids(pool_a.free_block_queue.get_all_free_blocks()) == [1, 2, 3]
    assert ids(pool_b.free_block_queue.get_all_free_blocks()) == [1, 2, 3]


# --------------------------------------------------------------------------- item 6
def _tamper(req, how, index=5):
    if how == "not bytes":
        req.block_hashes[index] = 12345
    elif how == "removed":
        del req.block_hashes[index + 1:]
    elif how == "None":
        req.block_hashes[index] = None


TAMPERINGS = {"not bytes": TypeError, "removed": RuntimeError, "None": TypeError}


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
