"""The package's layout: no star imports, and the vLLM-named modules say what they hold and where.

Each public module named after a vLLM one (``kvcy.block_pool``, ``kvcy.kv_cache_manager``, ...)
re-exports classes of the selected twin; its docstring names each class, the stem of the twin
files it lives in (``kvcy/_fast/kv_cache_c/<stem>.pyx`` and ``kvcy/_fast/kv_cache_py/<stem>.py``)
and how the twin is chosen.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from kvcy import _fast

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvcy"

#: Module -> {exported twin name: the stem of the twin files that define it}.
TWIN_EXPORTS = {
    "kvcy.block_pool": {"BlockPool": "block_pool", "BlockHashToBlockMap": "block_map"},
    "kvcy.kv_cache_manager": {"KVCacheManager": "kv_cache_manager", "KVCacheBlocks": "kv_cache_blocks"},
    "kvcy.kv_cache_coordinator": {
        name: "coordinators"
        for name in ("KVCacheCoordinator", "KVCacheCoordinatorNoPrefixCache", "UnitaryKVCacheCoordinator",
                     "HybridKVCacheCoordinator", "get_kv_cache_coordinator")
    },
    "kvcy.single_type_kv_cache_manager": {
        name: "single_type_managers"
        for name in ("SingleTypeKVCacheManager", "FullAttentionManager", "SlidingWindowManager",
                     "ChunkedLocalAttentionManager", "MambaManager", "CrossAttentionManager", "spec_manager_map",
                     "get_manager_for_kv_cache_spec")
    },
    "kvcy.kv_cache_utils": {"KVCacheBlock": "kv_cache_block", "FreeKVCacheBlockQueue": "free_queue"},
    "kvcy.request": {"Request": "request"},
}


def _sources(*suffixes: str) -> list[Path]:
    return sorted(p for suffix in suffixes for p in PACKAGE.rglob(f"*{suffix}"))


def test_no_star_imports():
    """Every name a kvcy module uses comes from an import that names it."""
    python = _sources(".py", ".pyi")
    assert len(python) > 20
    offenders = []
    for path in python:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    star = re.compile(r"^\s*from\s+\S+\s+c?import\s+\*", re.MULTILINE)
    for path in _sources(".pyx", ".pxd"):  # Cython: no ast, but the statement has one shape
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}" for m in star.finditer(text)]
    assert offenders == []


@pytest.mark.parametrize("module_name", sorted(TWIN_EXPORTS))
def test_vllm_named_modules_say_what_they_hold(module_name):
    module = importlib.import_module(module_name)
    doc = module.__doc__
    exports = TWIN_EXPORTS[module_name]
    twin = _fast.kv_cache
    for name, stem in exports.items():
        assert name in module.__all__
        assert getattr(module, name) is getattr(twin, name), f"{module_name}.{name} is not the selected twin's"
        assert f"``{name}``" in doc, f"{module_name}'s docstring does not name {name}"
        assert f"stem ``{stem}``" in doc, f"{module_name}'s docstring does not give {name}'s stem {stem}"
    for words in ("kvcy/_fast/kv_cache_c/S.pyx", "kvcy._fast._kv_cache_c", "kvcy/_fast/kv_cache_py/S.py",
                  "KVCY_NO_EXTENSIONS=1", "KVCY_REQUIRE_EXTENSIONS=1", "kvcy.IMPLEMENTATION"):
        assert words in doc, f"{module_name}'s docstring does not say {words}"


def test_named_stems_define_the_names():
    """Where the per-concept twin files exist, each stem a docstring names defines its names in both twins."""
    c_dir, py_dir = PACKAGE / "_fast" / "kv_cache_c", PACKAGE / "_fast" / "kv_cache_py"
    if not py_dir.is_dir():
        pytest.skip("the kv_cache twins are not split into per-concept files in this tree")
    defined = re.compile(r"^(?:cdef\s+class|class|def|cpdef\s+\w+|cpdef)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=", re.MULTILINE)
    for exports in TWIN_EXPORTS.values():
        for name, stem in exports.items():
            for path in (c_dir / f"{stem}.pyx", py_dir / f"{stem}.py"):
                names = {a or b for a, b in defined.findall(path.read_text(encoding="utf-8"))}
                assert name in names, f"{name} is not defined in {path.relative_to(ROOT)}"


#: kvcy.kv_cache_interface's submodules -> the public names each defines (one concept per module).
INTERFACE_MODULES = {
    "dtypes": {"canonical_dtype", "get_dtype_size"},
    "quant": {"KVQuantMode", "get_kv_quant_mode", "is_quantized_kv_cache", "kv_cache_uses_per_token_head_scales",
              "nvfp4_kv_cache_full_dim"},
    "base": {"KVCacheSpec", "MultipleOf", "num_states_for"},
    "attention": {"AttentionSpec"},
    "full_attention": {"FullAttentionSpec", "SinkFullAttentionSpec", "TQFullAttentionSpec"},
    "sliding_window": {"SlidingWindowSpec"},
    "chunked_local": {"ChunkedLocalAttentionSpec"},
    "mla": {"MLAAttentionSpec", "HiddenStateCacheSpec", "SlidingWindowMLASpec"},
    "mamba": {"MambaSpec"},
    "encoder_attention": {"EncoderOnlyAttentionSpec", "CrossAttentionSpec"},
    "uniform": {"UniformTypeKVCacheSpecs", "iter_layer_specs", "is_full_attention_spec"},
    "kinds": {"KVCacheSpecKind", "get_kv_cache_spec_kind", "get_kv_cache_spec_sliding_window"},
    "tensor": {"KVCacheTensor"},
    "config": {"KVCacheConfig", "KVCacheGroupRole", "KVCacheGroupSpec"},
    "layout": {"KVCacheLayout"},
    "views": {"compute_layer_kv_cache_shape_bytes", "reshape_kv_cache"},
    "_checks": {"cdiv"},
}


def test_kv_cache_interface_is_one_module_per_concept():
    """kvcy.kv_cache_interface is a package whose modules each define one concept's names,
    all re-exported from the package (``from kvcy.kv_cache_interface import X`` keeps working)."""
    import kvcy.kv_cache_interface as ki

    package_dir = PACKAGE / "kv_cache_interface"
    assert (package_dir / "__init__.py").is_file() and not (PACKAGE / "kv_cache_interface.py").exists()
    on_disk = {p.stem for p in package_dir.glob("*.py")} - {"__init__"}
    assert on_disk == set(INTERFACE_MODULES)
    exported = set(ki.__all__)
    assert set().union(*INTERFACE_MODULES.values()) >= exported
    for stem, names in INTERFACE_MODULES.items():
        module = importlib.import_module(f"kvcy.kv_cache_interface.{stem}")
        assert module.__doc__, f"kvcy.kv_cache_interface.{stem} has no docstring"
        for name in names:
            obj = getattr(module, name)
            assert obj.__module__ == module.__name__, f"{name} is not defined in {module.__name__}"
            assert getattr(ki, name) is obj, f"kvcy.kv_cache_interface.{name} is not {module.__name__}'s"
        lines = (package_dir / f"{stem}.py").read_text(encoding="utf-8").count("\n")
        assert lines < 400, f"kvcy/kv_cache_interface/{stem}.py has {lines} lines: split it by concept"


def test_kv_cache_interface_objects_pickle_by_their_module():
    import pickle

    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, KVCacheLayout, KVQuantMode, MambaSpec

    for obj in (
        FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=8),
        MambaSpec(block_size=16, shapes=((2, 3),), dtypes=("float32",)),
        KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="fp8")),
        KVCacheLayout.BLHNC,
        KVQuantMode.NVFP4,
    ):
        back = pickle.loads(pickle.dumps(obj))
        assert back == obj and type(back) is type(obj)
