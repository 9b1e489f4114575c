"""Install and packaging: build flags, the sdist and wheel contents, the compiled twin's stub.

The sdist + wheel build compiles one small extension (the hasher) and takes
about half a minute; it runs in the compiled-twin run only (what it checks
does not depend on the twin) and needs git, the ``build`` package and a C
compiler.  The no-compiler fallback is a step of .ci/run.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from kvcy import _fast
from kvcy._fast import _kv_cache_py, kv_cache_py

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "kvcy" / "_fast" / "_kv_cache_c.pyi"
_CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("KVCY_")}


def _run(args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: int = 300):
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**_CLEAN_ENV, **(env or {})})


# --------------------------------------------------------------------------- setup.py flags
def _setup_py(env: dict[str, str], hide_torch: bool) -> subprocess.CompletedProcess:
    """``setup.py --name`` (configuration only, nothing built), optionally with torch unimportable."""
    code = (
        "import runpy, sys\n"
        + ("sys.modules['torch'] = None\n" if hide_torch else "")
        + "sys.argv = ['setup.py', '--name']\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
    )
    return _run([sys.executable, "-c", code], env=env)


def test_build_torch_required_without_torch_fails_clearly():
    proc = _setup_py({"KVCY_BUILD_TORCH": "1"}, hide_torch=True)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "KVCY_BUILD_TORCH=1" in out and "torch is not importable" in out
    assert "--no-build-isolation" in out


def test_build_torch_auto_without_torch_says_so():
    proc = _setup_py({}, hide_torch=True)
    assert proc.returncode == 0, proc.stderr
    assert "torch is not importable in the build environment" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "kvcy"


def test_build_torch_off_and_bad_values():
    pytest.importorskip("torch")
    proc = _setup_py({"KVCY_BUILD_TORCH": "0"}, hide_torch=False)
    assert proc.returncode == 0, proc.stderr
    assert "kvcy._C not requested" in proc.stdout
    proc = _setup_py({"KVCY_BUILD_TORCH": "maybe"}, hide_torch=False)
    assert proc.returncode != 0
    assert "KVCY_BUILD_TORCH must be 1, 0 or unset" in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- kvcy.ops import warning
_OPS_WITHOUT_EXTENSION = (
    "import sys, warnings\n"
    "warnings.simplefilter('default')\n"
    "sys.modules['kvcy._C'] = None\n"
    "import kvcy.ops, importlib\n"
    "importlib.import_module('kvcy.ops')\n"
    "assert kvcy.ops.IMPLEMENTATION == 'reference'\n"
)


def test_ops_warns_once_without_the_extension():
    pytest.importorskip("torch")
    proc = _run([sys.executable, "-c", _OPS_WITHOUT_EXTENSION])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("RuntimeWarning") == 1, proc.stderr
    assert "KVCY_BUILD_TORCH=1" in proc.stderr and "KVCY_ALLOW_REFERENCE_OPS=1" in proc.stderr


@pytest.mark.parametrize("env", [{"KVCY_ALLOW_REFERENCE_OPS": "1"}, {"KVCY_NO_EXTENSIONS": "1"}])
def test_ops_warning_silenced(env):
    pytest.importorskip("torch")
    proc = _run([sys.executable, "-W", "error::RuntimeWarning", "-c", _OPS_WITHOUT_EXTENSION], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr


# --------------------------------------------------------------------------- the compiled twin's stub
def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    star = [a.vararg] if a.vararg else []
    starstar = [a.kwarg] if a.kwarg else []
    return [p.arg for p in a.posonlyargs + a.args + star + a.kwonlyargs + starstar]


def _stub_api() -> dict[str, dict[str, list[str] | None]]:
    """The stub's top-level names: class -> {member: parameter names, or None for attributes
    and properties}; function -> {"__call__": parameter names}; constant -> {}."""
    api: dict[str, dict[str, list[str] | None]] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            members: dict[str, list[str] | None] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    plain = all(isinstance(d, ast.Name) and d.id == "classmethod" for d in item.decorator_list)
                    members[item.name] = _params(item) if plain else None
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = None
            api[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            api[node.name] = {"__call__": _params(node)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            api[node.target.id] = {}
    return api


def test_stub_names_match_the_pure_twin():
    # The pure twin's code lives one concept per module in kvcy/_fast/kv_cache_py/;
    # _kv_cache_py assembles the public names (its __all__) from them.
    defined = set()
    for info in pkgutil.iter_modules(kv_cache_py.__path__):
        mod = importlib.import_module(f"{kv_cache_py.__name__}.{info.name}")
        defined |= {
            name for name, obj in vars(mod).items()
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == mod.__name__
        }
    assert set(_kv_cache_py.__all__) == defined | {"IMPLEMENTATION", "logger", "spec_manager_map"}
    assert set(_stub_api()) == set(_kv_cache_py.__all__)


def test_stub_members_and_signatures_match_the_pure_twin():
    api = _stub_api()
    for name, members in api.items():
        obj = getattr(_kv_cache_py, name)
        if inspect.isfunction(obj):
            assert members["__call__"] == list(inspect.signature(obj).parameters), name
        if not inspect.isclass(obj):
            continue
        dunders = ("__init__", "__len__", "__add__", "__eq__", "__getitem__")
        for member in vars(obj):
            if member.startswith("_") and member not in dunders:
                continue
            # An override is typed once, on the stub's base class.
            assert any(member in api.get(c.__name__, {}) for c in obj.__mro__), f"{name}.{member} not in the stub"
        for member, params in members.items():
            if params is None:
                continue
            runtime = getattr(inspect.getattr_static(obj, member), "__func__", inspect.getattr_static(obj, member))
            assert params == list(inspect.signature(runtime).parameters), f"{name}.{member}"


# --------------------------------------------------------------------------- the included sources
def _includes(twin: str) -> list[str]:
    """The files ``_<twin>_c.pyx`` / ``.pxd`` ``include`` (repository-relative), in order."""
    out = []
    for assembly in (f"_{twin}_c.pyx", f"_{twin}_c.pxd"):
        for line in (ROOT / "kvcy" / "_fast" / assembly).read_text().splitlines():
            if line.startswith("include "):
                out.append("kvcy/_fast/" + ast.literal_eval(line.split(None, 1)[1]))
    return out


#: The compiled twins assembled from per-concept sources: twin -> the folder of its pieces.
ASSEMBLED = {"kv_cache": "kv_cache_c", "offload": "offload_c"}


@pytest.mark.parametrize("twin", sorted(ASSEMBLED))
def test_compiled_twin_is_assembled_from_every_included_source(twin):
    included = _includes(twin)
    assert len(included) == len(set(included)) and included, included
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kvcy" / "_fast" / ASSEMBLED[twin]).iterdir())
    # Every piece is included once, nothing else lies there (no __init__.py: not a package).
    assert sorted(included) == on_disk
    # Each concept's implementation (.pyx) comes with its declarations (.pxd).
    stems = {suffix: [Path(r).stem for r in included if r.endswith(suffix)] for suffix in (".pyx", ".pxd")}
    assert stems[".pyx"] == stems[".pxd"] and len(stems[".pyx"]) * 2 == len(included)


def test_setup_builds_one_extension_per_twin_that_depends_on_its_includes():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['setup.py', '--name']\n"
        "g = runpy.run_path('setup.py', run_name='__main__')\n"
        "for e in g['_all_exts']:\n"
        "    print('EXT', e.name, *e.sources, *e.depends)\n"
    )
    proc = _run([sys.executable, "-c", code], env={"KVCY_BUILD_TORCH": "0"})
    assert proc.returncode == 0, proc.stderr
    exts = {row[1]: row[2:] for row in (line.split() for line in proc.stdout.splitlines()) if row[:1] == ["EXT"]}
    for twin, folder in ASSEMBLED.items():
        # One extension per twin: its pieces are not compiled on their own.
        assert not [name for name in exts if f"{folder}." in name], exts
        files = exts[f"kvcy._fast._{twin}_c"]
        assert files[0] == f"kvcy/_fast/_{twin}_c.pyx"
        # A change to an included file rebuilds the extension.
        assert sorted(_includes(twin)) == sorted(files[1:]), twin


# --------------------------------------------------------------------------- sdist and wheel
def _elf_section_names(data: bytes) -> list[str]:
    """Section names of a little-endian 64-bit ELF file."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a little-endian ELF64 file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off, strtab_size = headers[shstrndx][4], headers[shstrndx][5]
    strtab = data[strtab_off:strtab_off + strtab_size]
    return [strtab[h[0]:strtab.index(b"\0", h[0])].decode() for h in headers]


def _c_compiler() -> str | None:
    import sysconfig

    cc = os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """An sdist of the working tree, and a wheel built from it with the hasher compiled."""
    if _fast.NO_EXTENSIONS:
        pytest.skip("KVCY_NO_EXTENSIONS=1: the packaging build runs in the compiled-twin run")
    pytest.importorskip("build")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    if _c_compiler() is None:
        pytest.skip("needs a C compiler")
    tmp = tmp_path_factory.mktemp("packaging")
    src, out = tmp / "src", tmp / "dist"
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    for rel in filter(None, files.split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    env = {"KVCY_BUILD_ONLY": "kvcy._fast._hashing_c", "KVCY_BUILD_TORCH": "0"}
    proc = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)], env=env,
                timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kvcy: compiled extensions: kvcy._fast._hashing_c" in proc.stdout, proc.stdout[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def test_sdist_has_sources_and_no_generated_c(dists):
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for rel in ("LICENSE", "MANIFEST.in", "setup.py", "pyproject.toml", "kvcy/py.typed"):
        assert rel in names, rel
    tracked = _run(["git", "ls-files", "cuda_ext", "kvcy/_fast"]).stdout.split()
    wanted = [t for t in tracked if t.startswith("cuda_ext/") or t.endswith((".pyx", ".pxd", ".pyi", ".h"))]
    assert any(t.startswith("cuda_ext/") for t in wanted) and any(t.endswith(".pyx") for t in wanted)
    assert sorted(set(wanted) - names) == []
    for twin in ASSEMBLED:
        assert sorted(set(_includes(twin)) - names) == [], twin
    generated = [n for n in names if n.startswith("kvcy/") and n.endswith((".c", ".cpp", ".so", ".html"))]
    assert generated == []


def test_wheel_has_stubs_license_and_no_generated_c(dists):
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = whl.namelist()
        metadata = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        sos = {n: whl.read(n) for n in names if n.endswith(".so")}
    assert [n for n in names if n.endswith((".c", ".cpp", ".html"))] == []
    for rel in ("kvcy/py.typed", "kvcy/_fast/_kv_cache_c.pyi", "kvcy/_fast/_hashing_c.pyi", "kvcy/_fast/_kv_index_c.pyi",
                "kvcy/_fast/_kv_index.h"):
        assert rel in names, rel
    for twin in ASSEMBLED:
        # _<twin>_c.pxd (shipped for cimport) includes these.
        assert sorted(set(_includes(twin)) - set(names)) == [], twin
        # The pure twin's per-concept modules (a package of their own) ship too.
        folder = f"kvcy/_fast/{twin}_py"
        pure = sorted(f"{folder}/{p.name}" for p in (ROOT / folder).glob("*.py"))
        assert f"{folder}/__init__.py" in pure
        assert sorted(set(pure) - set(names)) == [], twin
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "License-Expression: Apache-2.0" in metadata
    assert [n for n in sos if "_hashing_c" in n], names
    if sys.platform.startswith("linux"):
        for name, data in sos.items():
            sections = _elf_section_names(data)
            assert not [s for s in sections if s.startswith(".debug")], (name, sections)


def test_ci_vllm_step_runs_every_module_with_live_vllm_checks():
    """A test module that imports vLLM only runs its live checks in CI's vLLM step (the
    main runs have no vLLM and skip them), so every such module must be on that step's list."""
    import re

    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    listed = set(re.search(r"VLLM_TESTS=\(([^)]*)\)", run).group(1).split())
    live = re.compile(r"^\s*(import vllm|from vllm)|importorskip\(.vllm|find_spec\(.vllm", re.M)
    modules = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "tests").rglob("test_*.py") if live.search(p.read_text(encoding="utf-8"))
    }
    assert len(modules) >= 5

    def run_by_the_step(module: str) -> bool:  # listed itself, or inside a listed folder
        return any(module == name or module.startswith(name.rstrip("/") + "/") for name in listed)

    missing = sorted(m for m in modules if not run_by_the_step(m))
    assert not missing, f"not run by .ci/run's vLLM step: {missing}"
    assert all((ROOT / name).exists() for name in listed)
