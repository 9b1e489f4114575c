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

from kvcy.hashing import get_hash_fn_by_name, init_none_hash

from _public_state import ASSIGNABLE, BAD_ASSIGNMENTS, _data_attributes, _objects

BS = 4
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


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
