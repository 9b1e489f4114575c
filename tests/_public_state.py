"""The twins' user-reachable objects and the assignment tables the public-state checks share
(tests/twins/test_public_state.py, tests/twins/test_twin_parity.py)."""

from __future__ import annotations

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

BS = 4


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
