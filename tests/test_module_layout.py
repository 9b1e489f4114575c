"""The package's layout: no star imports, and the vLLM-named modules say what they hold and where.

Each public module named after a vLLM one (``kvcy.block_pool``, ``kvcy.kv_cache_manager``, ...)
re-exports classes of the selected twin; its docstring names each class, the stem of the twin
files it lives in (``kvcy/_fast/kv_cache_c/<stem>.pyx`` and ``kvcy/_fast/kv_cache_py/<stem>.py``)
and how the twin is chosen.  The CPU offloading tier's modules (``kvcy.kv_offload.cpu...``) do
the same for the offloading twins (``kvcy/_fast/offload_c/<stem>.pyx``,
``kvcy/_fast/offload_py/<stem>.py``).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from kvcy import _fast
from kvcy.kv_offload import _twin as _offload_twin

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
        **{name: "single_type_managers"
           for name in ("SingleTypeKVCacheManager", "FullAttentionManager", "SinkFullAttentionManager",
                        "CrossAttentionManager")},
        "MambaManager": "mamba_manager",
        "SlidingWindowManager": "local_attention_managers",
        "ChunkedLocalAttentionManager": "local_attention_managers",
        "RSWAManager": "local_attention_managers",
        "CircularBufferManager": "local_attention_managers",
        "spec_manager_map": "manager_factory",
        "get_manager_for_kv_cache_spec": "manager_factory",
    },
    "kvcy.kv_cache_utils": {"KVCacheBlock": "kv_cache_block", "FreeKVCacheBlockQueue": "free_queue",
                            "partial_hash_hits_enabled": "mamba_manager", "eagle_proof_margin": "mamba_manager"},
    "kvcy.request": {"Request": "request"},
}

#: The same for the offloading twins (kvcy/_fast/offload_c/, kvcy/_fast/offload_py/).
OFFLOAD_TWIN_EXPORTS = {
    "kvcy.kv_offload.cpu.manager": {"CPUOffloadingManager": "manager"},
    "kvcy.kv_offload.cpu.policies.base": {
        "ChunkStatus": "chunk_status", "CachePolicy": "cache_policy", "order_request_keys": "request_order",
    },
    "kvcy.kv_offload.cpu.policies.lru": {"LRUCachePolicy": "lru_policy"},
    "kvcy.kv_offload.cpu.policies.arc": {"ARCCachePolicy": "arc_policy"},
}

#: Which twin each table describes: (exports, the live twin module, compiled dir, pure dir, extension).
LAYOUTS = {
    "kv_cache": (TWIN_EXPORTS, lambda: _fast.kv_cache, "kv_cache_c", "kv_cache_py", "kvcy._fast._kv_cache_c"),
    "offload": (OFFLOAD_TWIN_EXPORTS, lambda: _offload_twin.twin, "offload_c", "offload_py",
                "kvcy._fast._offload_c"),
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


@pytest.mark.parametrize(
    ("layout", "module_name"), [(layout, name) for layout, spec in LAYOUTS.items() for name in sorted(spec[0])]
)
def test_vllm_named_modules_say_what_they_hold(layout, module_name):
    module = importlib.import_module(module_name)
    doc = module.__doc__
    table, live, c_dir, py_dir, extension = LAYOUTS[layout]
    exports = table[module_name]
    twin = live()
    for name, stem in exports.items():
        assert name in module.__all__
        assert getattr(module, name) is getattr(twin, name), f"{module_name}.{name} is not the selected twin's"
        assert f"``{name}``" in doc, f"{module_name}'s docstring does not name {name}"
        assert f"stem ``{stem}``" in doc, f"{module_name}'s docstring does not give {name}'s stem {stem}"
    for words in (f"kvcy/_fast/{c_dir}/S.pyx", extension, f"kvcy/_fast/{py_dir}/S.py",
                  "KVCY_NO_EXTENSIONS=1", "KVCY_REQUIRE_EXTENSIONS=1", "kvcy.IMPLEMENTATION"):
        assert words in doc, f"{module_name}'s docstring does not say {words}"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_named_stems_define_the_names(layout):
    """Where the per-concept twin files exist, each stem a docstring names defines its names in both twins."""
    table, _, c_name, py_name, _ = LAYOUTS[layout]
    c_dir, py_dir = PACKAGE / "_fast" / c_name, PACKAGE / "_fast" / py_name
    if not py_dir.is_dir():
        pytest.skip(f"the {layout} twins are not split into per-concept files in this tree")
    defined = re.compile(r"^(?:cdef\s+class|class|def|cpdef\s+\w+|cpdef)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=", re.MULTILINE)
    for exports in table.values():
        for name, stem in exports.items():
            for path in (c_dir / f"{stem}.pyx", py_dir / f"{stem}.py"):
                names = {a or b for a, b in defined.findall(path.read_text(encoding="utf-8"))}
                assert name in names, f"{name} is not defined in {path.relative_to(ROOT)}"


#: kvcy.kv_cache_interface's submodules -> the public names each defines (one concept per module).
INTERFACE_MODULES = {
    "dtypes": {"canonical_dtype", "get_dtype_size"},
    "quant": {"KVQuantMode", "get_kv_quant_mode", "is_quantized_kv_cache", "kv_cache_uses_per_token_head_scales",
              "nvfp4_kv_cache_full_dim"},
    "base": {"KVCacheSpec", "MultipleOf", "num_states_for", "replace_as"},
    "registry": {"KVCacheSpecRegistry", "KVCacheSpecMetadata", "register_kv_cache_spec"},
    "attention": {"AttentionSpec"},
    "full_attention": {"FullAttentionSpec", "SinkFullAttentionSpec", "TQFullAttentionSpec"},
    "sliding_window": {"SlidingWindowSpec"},
    "chunked_local": {"ChunkedLocalAttentionSpec"},
    "rswa": {"RSWASpec"},
    "circular_buffer": {"CircularBufferSpec"},
    "hisparse": {"HiSparseHotSpec", "HiSparseResidentSpec"},
    "mla": {"MLAAttentionSpec", "HiddenStateCacheSpec", "SlidingWindowMLASpec", "SparseCacheRole"},
    "mamba": {"MambaSpec"},
    "encoder_attention": {"EncoderOnlyAttentionSpec", "CrossAttentionSpec"},
    "uniform": {"UniformTypeKVCacheSpecs", "iter_layer_specs", "is_full_attention_spec"},
    "kinds": {"KVCacheSpecKind", "get_kv_cache_spec_kind", "get_kv_cache_spec_sliding_window"},
    "tensor": {"KVCacheTensor"},
    "config": {"KVCacheConfig", "KVCacheGroupRole", "KVCacheGroupSpec"},
    "layout": {"KVCacheLayout"},
    "packed_layouts": {"customize_spec"},
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
    assert set().union(*INTERFACE_MODULES.values()) >= {n for n in exported if callable(getattr(ki, n))}
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


#: Lines a per-concept twin file may have at most: one concept, not a file to scroll through.
MAX_CONCEPT_LINES = 1000


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_split_twins_keep_one_concept_per_file(layout):
    """The compiled and pure twins have the same stems, and no piece grows into a whole layer again."""
    _, _, c_name, py_name, _ = LAYOUTS[layout]
    c_dir, py_dir = PACKAGE / "_fast" / c_name, PACKAGE / "_fast" / py_name
    pure = {p.stem for p in py_dir.glob("*.py")} - {"__init__"}
    assert len(pure) >= 5
    assert {p.stem for p in c_dir.glob("*.pyx")} == pure
    assert {p.stem for p in c_dir.glob("*.pxd")} == pure
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*c_dir.glob("*.pyx"), *c_dir.glob("*.pxd"), *py_dir.glob("*.py")]
        if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_CONCEPT_LINES
    }
    assert long == {}
    # The assembled twins only put the pieces together.
    assert (PACKAGE / "_fast" / f"_{layout}_c.pyx").read_text(encoding="utf-8").count("\n") < 150
    assert (PACKAGE / "_fast" / f"_{layout}_py.py").read_text(encoding="utf-8").count("\n") < 150
