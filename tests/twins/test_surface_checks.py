"""Targeted checks for crashes and twin disagreements the surface fuzzer (tests/_api_fuzz.py) found.

A check that crashed the compiled twin runs in a subprocess, so that a regression fails
the test instead of ending the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(impl_name: str, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    prelude = f"from kvcy import _fast\nkv = _fast.load({impl_name!r})['kv_cache']\n"
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, env=env)


def test_find_longest_cache_hit_refuses_no_groups(impl):
    """Every manager's find_longest_cache_hit returns one list per group; with no group the
    compiled twin read past an empty tuple (SIGSEGV).  Both twins now refuse it alike."""
    proc = _run(impl.name, """
        from kvcy.kv_cache_interface import (ChunkedLocalAttentionSpec, CrossAttentionSpec, FullAttentionSpec,
                                             MambaSpec, SlidingWindowSpec)
        attn = dict(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
        specs = [FullAttentionSpec(**attn), SlidingWindowSpec(sliding_window=6, **attn),
                 ChunkedLocalAttentionSpec(attention_chunk_size=8, **attn), CrossAttentionSpec(**attn),
                 MambaSpec(block_size=4, shapes=((2,),), dtypes=("float32",))]
        pool = kv.BlockPool(8, True, 4)
        for spec in specs:
            for empty in ([], (), set(), b""):
                try:
                    kv._manager_class(spec).find_longest_cache_hit([b"x" * 32] * 4, 12, empty, pool, spec, False, 4)
                except ValueError as exc:
                    print(type(spec).__name__, exc)
                else:
                    print(type(spec).__name__, "accepted")
    """)
    assert proc.returncode == 0, f"the interpreter died ({proc.returncode}):\n{proc.stderr[-2000:]}"
    lines = proc.stdout.splitlines()
    assert len(lines) == 20
    assert all(line.endswith(" kv_cache_group_ids must not be empty") for line in lines), lines


@pytest.mark.parametrize("pool, alignment, error", [
    (None, 4, "TypeError: block_pool must be a BlockPool, got NoneType"),
    ("pool", 4, "TypeError: block_pool must be a BlockPool, got str"),
    (True, 0, "ValueError: alignment_tokens must be positive, got 0"),
    (True, False, "TypeError: alignment_tokens must be an int, got bool"),
    (True, -4, "ValueError: alignment_tokens must be non-negative, got -4"),
])
def test_find_longest_cache_hit_checks_pool_and_alignment(impl, pool, alignment, error):
    """A pool that is not one (SIGSEGV) and a zero alignment (SIGFPE: the hit length is
    rounded down to a multiple of it) crashed the compiled twin; both twins now refuse them
    alike, before any lookup."""
    proc = _run(impl.name, f"""
        from kvcy.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, MambaSpec
        attn = dict(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
        pool = kv.BlockPool(8, True, 4) if {pool!r} is True else {pool!r}
        for spec in (FullAttentionSpec(**attn), SlidingWindowSpec(sliding_window=6, **attn),
                     MambaSpec(block_size=4, shapes=((2,),), dtypes=("float32",))):
            try:
                kv._manager_class(spec).find_longest_cache_hit([b"x" * 32] * 4, 7, [0], pool, spec, False,
                                                               {alignment!r})
            except (TypeError, ValueError) as exc:
                print(f"{{type(exc).__name__}}: {{exc}}")
    """)
    assert proc.returncode == 0, f"the interpreter died ({proc.returncode}):\n{proc.stderr[-2000:]}"
    assert proc.stdout.splitlines() == [error] * 3


def test_find_longest_cache_hit_is_class_level(impl):
    """find_longest_cache_hit is a classmethod, as in vLLM: it reads the spec and the pool and
    builds no manager (the compiled twin built a throwaway one per call).  A subclass whose
    constructor refuses still answers, with its base class's hits."""
    from types import SimpleNamespace

    from kvcy.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec,
                                         SlidingWindowSpec)

    kv = impl.kv_cache
    attn = dict(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    specs = [FullAttentionSpec(**attn), SlidingWindowSpec(sliding_window=6, **attn),
             ChunkedLocalAttentionSpec(attention_chunk_size=8, **attn),
             MambaSpec(block_size=4, shapes=((2,),), dtypes=("float32",))]
    pool = kv.BlockPool(16, True, 4)
    hashes = [bytes([i]) * 32 for i in range(6)]
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(SimpleNamespace(request_id="r", block_hashes=hashes), blocks, 0, 4, 4, 0)
    for spec in specs:
        base = kv._manager_class(spec)

        class Refusing(base):
            def __init__(self, *args, **kwargs):
                raise AssertionError("find_longest_cache_hit built a manager")

        want = base.find_longest_cache_hit(hashes, 20, [0], pool, spec, False, 4)
        got = Refusing.find_longest_cache_hit(hashes, 20, [0], pool, spec, False, 4)
        assert want[1] > 0, type(spec).__name__
        assert got[1] == want[1]
        assert [[b.block_id for b in g] for g in got[0]] == [[b.block_id for b in g] for g in want[0]]


def test_allocate_external_computed_blocks_already_held_is_a_no_op(impl):
    """A request already holding more blocks than its token count needs: the Python twin's
    get_new_blocks refused the negative count, the compiled twin handed it to the unchecked
    pop (SystemError from PyList_New).  Both now do nothing, as vLLM 0.33.0 does."""
    proc = _run(impl.name, """
        from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
        cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
        mgr = kv.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                                enable_caching=False)
        req = kv.Request("r0", list(range(20)))
        assert mgr.allocate_slots(req, 20) is not None
        stm = mgr.coordinator.single_type_managers[0]
        free = [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
        stm.allocate_external_computed_blocks("r0", 3, 7)
        print("ok")
        assert [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()] == free
        assert len(stm.req_to_blocks["r0"]) == 5
    """)
    assert proc.returncode == 0, f"failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
    assert proc.stdout.splitlines() == ["ok"]


@pytest.mark.parametrize("key", [None, b"abc", "abcd", bytearray(b"abcde"), 5])
def test_block_hash_refuses_what_is_not_a_cache_key(impl, key):
    """The compiled twin checked a block's cache key (hash bytes + 4-byte group id) while the
    Python twin took anything; both now refuse the same values, with the same message."""
    for assign in (lambda b: setattr(b, "block_hash", key), lambda b: b.set_block_hash(key, 4)):
        block = impl.kv_cache.KVCacheBlock(1)
        with pytest.raises(ValueError, match="a cache key is a block hash followed by a 4-byte group id"):
            assign(block)
        assert block.block_hash is None and block.block_hash_num_tokens is None
    block = impl.kv_cache.KVCacheBlock(1)
    block.set_block_hash(b"h" * 32 + bytes(4), 4)
    assert block.block_hash == b"h" * 32 + bytes(4) and block.block_hash_num_tokens == 4


def test_allocate_slots_ignores_what_callers_do_to_the_empty_blocks(impl):
    """get_computed_blocks hands out the manager's empty KVCacheBlocks; a caller reassigning
    its ``blocks`` made the compiled twin's allocate_slots index a tuple of no groups
    (SIGSEGV) and the Python twin's raise IndexError.  Neither reads it any more."""
    proc = _run(impl.name, """
        from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
        from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
        init_none_hash(get_hash_fn_by_name("sha256"))
        attn = dict(num_kv_heads=1, head_size=8, dtype="float16")
        cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=8, **attn)),
            KVCacheGroupSpec(["b"], SlidingWindowSpec(block_size=4, sliding_window=6, **attn))])
        mgr = kv.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=8, hash_block_size=4)
        hasher = get_request_block_hasher(4, get_hash_fn_by_name("sha256"))
        req = kv.Request("r1", list(range(12)), block_hasher=hasher)
        empty, hit, _ = mgr.get_computed_blocks(req)
        assert hit == 0 and empty is mgr.empty_kv_cache_blocks
        empty.blocks = ()
        print(mgr.allocate_slots(req, 12).get_block_ids())
        print(mgr.allocate_slots(kv.Request("r2", [1, 2, 3]), 3, new_computed_blocks=empty).get_block_ids())
    """)
    assert proc.returncode == 0, f"failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
    assert proc.stdout.splitlines() == ["([1, 2], [3, 4, 5])", "([6], [7])"]
