"""Objects whose ``__init__`` never ran cannot crash the interpreter, and nothing unpickles into one.

A compiled class's C code trusts its fields: sizes it divides by (C division, no zero
check) and the pool, coordinator and managers it calls into.  An object made by
``cls.__new__(cls)`` alone, or by a Python subclass whose ``__init__`` skips the base's,
has zero sizes and ``None`` in those fields.  The twins refuse ``__new__`` without
arguments for the manager, coordinator and single-type manager classes; a subclass that
skips ``__init__`` gets clear ``AttributeError``\\ s (``nonecheck``) and no zero divisor.
Cython's generated pickling is off: its ``__setstate_cython__`` read the state tuple
without a bounds check (``obj.__setstate__(())`` crashed) and could set fields out of step.
"""

from __future__ import annotations

import inspect
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from kvcy import _fast

ROOT = Path(__file__).resolve().parents[1]
SWEEP = Path(__file__).with_name("_uninit_sweep.py")
compiled = pytest.mark.skipif("cython" not in _fast.available() or _fast.NO_EXTENSIONS,
                              reason="compiled twins not in use")

REFUSED = ["KVCacheManager", "KVCacheCoordinator", "KVCacheCoordinatorNoPrefixCache", "UnitaryKVCacheCoordinator",
           "HybridKVCacheCoordinator", "SingleTypeKVCacheManager", "FullAttentionManager", "SlidingWindowManager",
           "ChunkedLocalAttentionManager", "MambaManager", "CrossAttentionManager", "RSWAManager",
           "CircularBufferManager", "SinkFullAttentionManager"]


@pytest.mark.parametrize("name", REFUSED)
def test_new_alone_is_refused_alike(impl, name):
    cls = getattr(impl.kv_cache, name)
    with pytest.raises(TypeError, match=f"^{name} cannot be made without its arguments \\(by __new__ alone\\)"):
        cls.__new__(cls)


@pytest.mark.parametrize("mode", ["new", "subclass"])
def test_every_method_of_an_uninitialised_object_is_survived(impl, mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if impl.name == "python":
        env["KVCY_NO_EXTENSIONS"] = "1"
        env.pop("KVCY_REQUIRE_EXTENSIONS", None)
    else:
        env.pop("KVCY_NO_EXTENSIONS", None)
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(SWEEP), mode],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"the interpreter died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    assert proc.stdout.splitlines()[-1:] == ["done"], proc.stdout[-2000:]


def test_a_subclass_that_skips_init_gets_attribute_errors(impl):
    sub = type("Sub", (impl.kv_cache.KVCacheManager,), {"__init__": lambda self, *args, **kwargs: None})
    manager = sub(1)
    for method in ("reset_prefix_cache", "take_new_block_ids", "take_kv_cache_block_copies"):
        with pytest.raises(AttributeError):
            getattr(manager, method)()


def test_kv_cache_blocks_add_only_kv_cache_blocks(impl):
    blocks = impl.kv_cache.KVCacheBlocks(([impl.kv_cache.KVCacheBlock(1)],))
    for other in (None, 1, ([],)):
        with pytest.raises(TypeError, match="unsupported operand"):
            blocks + other
    assert (blocks + blocks).get_block_ids() == ([1, 1],)


@compiled
def test_compiled_classes_have_no_generated_pickling():
    twins = [_fast.load("cython")[name] for name in _fast.TWINS]
    found = [f"{mod.__name__}.{name}" for mod in twins for name, cls in vars(mod).items()
             if inspect.isclass(cls) and (hasattr(cls, "__setstate_cython__") or hasattr(cls, "__reduce_cython__"))]
    assert found == []
    kv = _fast.load("cython")["kv_cache"]
    for obj in (kv.KVCacheBlock(1), kv.KVCacheBlocks(([],))):
        with pytest.raises(TypeError, match="cannot pickle"):
            pickle.dumps(obj)


def test_pop_blocks_for_free_of_a_non_request_is_the_apis_type_error(impl):
    """Like every other manager call taking a request, not an AttributeError from ``None.request_id``."""
    from kvcy.hashing import get_hash_fn_by_name, init_none_hash
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    init_none_hash(get_hash_fn_by_name("sha256"))
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    manager = impl.kv_cache.KVCacheManager(config, max_model_len=64, scheduler_block_size=4, hash_block_size=4)
    for bad in (None, "r0", 3):
        with pytest.raises(TypeError, match="expected a Request"):
            manager.pop_blocks_for_free(bad)
