"""What Python can do to the twins' public state must not crash, corrupt or leak: assignments
to every compiled attribute, refused or checked alike in both twins.

A check that could crash the interpreter runs in a subprocess, and a signal counts as a failure.
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


ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("case", list(CRASHERS))
def test_assigning_internals_cannot_crash(impl, case):
    assert_clean_exit(run_isolated(impl, textwrap.dedent(CRASHERS[case]) + "print('survived')\n"))


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
