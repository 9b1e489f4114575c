"""The package's layout: no star imports, and the twins' files carry vLLM's module names.

Each public module named after a vLLM one (``kvcy.block_pool``, ``kvcy.kv_cache_manager``, ...)
re-exports classes of the selected twin, which live in the twin files named after that module
(``kvcy/_fast/kv_cache_c/<stem>.pyx`` and ``kvcy/_fast/kv_cache_py/<stem>.py``, the stem being the
module's name or starting with it); its docstring names each class, its stem and how the twin is
chosen.  The CPU offloading tier's modules (``kvcy.kv_offload.cpu...``) do the same for the
offloading twins (``kvcy/_fast/offload_c/<stem>.pyx``, ``kvcy/_fast/offload_py/<stem>.py``), with
stems named from below ``kvcy.kv_offload.cpu`` (``policies.lru`` -> ``policies_lru``).
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


#: Which twin each public module re-exports: (the package its stem is named from, the public modules,
#: the live twin module, compiled dir, pure dir, extension).  The rule a newcomer can follow: a class
#: or function ``kvcy.X`` re-exports from the twins lives in ``<dir>/S.pyx`` and ``<dir>/S.py``,
#: where ``S`` is ``X`` below that package with dots as underscores (``kvcy.block_pool`` -> ``block_pool``,
#: ``kvcy.kv_offload.cpu.policies.lru`` -> ``policies_lru``), or ``S`` starts with it and ``_`` where a
#: concept has a file of its own (``kv_cache_utils_free_queue``), as vLLM's names go.
LAYOUTS = {
    "kv_cache": (
        "kvcy.",
        ("kvcy.block_pool", "kvcy.kv_cache_manager", "kvcy.kv_cache_coordinator",
         "kvcy.single_type_kv_cache_manager", "kvcy.kv_cache_utils", "kvcy.request"),
        lambda: _fast.kv_cache, "kv_cache_c", "kv_cache_py", "kvcy._fast._kv_cache_c",
    ),
    "offload": (
        "kvcy.kv_offload.cpu.",
        ("kvcy.kv_offload.cpu.manager", "kvcy.kv_offload.cpu.policies.base", "kvcy.kv_offload.cpu.policies.lru",
         "kvcy.kv_offload.cpu.policies.arc"),
        lambda: _fast.offload, "offload_c", "offload_py", "kvcy._fast._offload_c",
    ),
}

#: The exceptions to the rule: helpers vLLM keeps in ``kv_cache_utils`` that live beside their
#: only caller, Mamba's manager.
ELSEWHERE = {
    "partial_hash_hits_enabled": "single_type_kv_cache_manager_mamba",
    "eagle_proof_margin": "single_type_kv_cache_manager_mamba",
}

_DEFINED = re.compile(r"^(?:cdef\s+class|class|def|cpdef\s+\w+|cpdef)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=", re.MULTILINE)


def _stems_defining(directory: Path, suffix: str) -> dict[str, set[str]]:
    """Name -> the stems of the files in ``directory`` that define it at top level."""
    found: dict[str, set[str]] = {}
    for path in directory.glob(f"*{suffix}"):
        for a, b in _DEFINED.findall(path.read_text(encoding="utf-8")):
            found.setdefault(a or b, set()).add(path.stem)
    return found


def _twin_exports(module, twin, defined: dict[str, set[str]]) -> list[str]:
    """The names ``module`` re-exports from the selected twin that the twin's files define."""
    return [
        name for name in module.__all__
        if name in defined and getattr(twin, name, None) is getattr(module, name)
    ]


def _module_cases():
    return [(layout, name) for layout, spec in LAYOUTS.items() for name in spec[1]]


@pytest.mark.parametrize(("layout", "module_name"), _module_cases())
def test_vllm_named_modules_say_what_they_hold(layout, module_name):
    """Each twin name a public module exports lives in the twin files its module name gives,
    in both twins, and the module's docstring says so."""
    package, _, live, c_name, py_name, extension = LAYOUTS[layout]
    module = importlib.import_module(module_name)
    doc = module.__doc__
    twin = live()
    c_dir, py_dir = PACKAGE / "_fast" / c_name, PACKAGE / "_fast" / py_name
    compiled, pure = _stems_defining(c_dir, ".pyx"), _stems_defining(py_dir, ".py")
    exports = _twin_exports(module, twin, pure)
    assert exports, f"{module_name} re-exports nothing from the twins"
    prefix = module_name.removeprefix(package).replace(".", "_")
    for name in exports:
        stems = pure.get(name, set())
        assert len(stems) == 1, f"{name} is defined in {sorted(stems)} under {py_dir.relative_to(ROOT)}"
        (stem,) = stems
        assert stem in compiled.get(name, set()), f"{name} is not defined in {c_name}/{stem}.pyx"
        if name in ELSEWHERE:
            assert stem == ELSEWHERE[name]
        else:
            assert stem == prefix or stem.startswith(prefix + "_"), (
                f"{module_name}.{name} lives in stem {stem}, not {prefix} or {prefix}_*"
            )
        assert f"``{name}``" in doc, f"{module_name}'s docstring does not name {name}"
        assert f"stem ``{stem}``" in doc, f"{module_name}'s docstring does not give {name}'s stem {stem}"
    for words in (f"kvcy/_fast/{c_name}/S.pyx", extension, f"kvcy/_fast/{py_name}/S.py",
                  "KVCY_NO_EXTENSIONS=1", "KVCY_REQUIRE_EXTENSIONS=1", "kvcy.IMPLEMENTATION"):
        assert words in doc, f"{module_name}'s docstring does not say {words}"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_twin_files_carry_vllm_stems(layout):
    """Every twin file but the shared helpers (``_common``) is named after a public module."""
    package, modules, _, c_name, py_name, _ = LAYOUTS[layout]
    prefixes = {m.removeprefix(package).replace(".", "_") for m in modules}
    if layout == "offload":
        prefixes.add("offloading_connector")  # vLLM's offloading_connector.py; the replay's connector
    stems = {p.stem for p in (PACKAGE / "_fast" / py_name).glob("*.py")} - {"__init__", "_common"}
    strays = {s for s in stems if not any(s == p or s.startswith(p + "_") for p in prefixes)}
    assert strays == set()


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
    _, _, _, c_name, py_name, _ = LAYOUTS[layout]
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
