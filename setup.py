"""Build script for kvcy.

Two kinds of compiled code, both optional:

* Cython twins of the hot paths (``kvcy/_fast/_<thing>_c.pyx``), listed in
  ``CYTHON_MODULES``.  With no working C compiler, or no Cython, nothing is
  compiled and the pure-Python twins are used (``kvcy.IMPLEMENTATION ==
  "python"``).
* A torch C++/CUDA extension (``cuda_ext/`` -> ``kvcy._C``, the kernels behind
  ``kvcy.ops``); its CUDA sources only when torch has CUDA and nvcc is found.

The build says what it did in lines starting ``kvcy:`` (``pip install -v``).

Environment variables:

``KVCY_BUILD_TORCH``
    ``1``: build ``kvcy._C``, and fail when torch is not importable in the build
    environment (install torch first and build with ``--no-build-isolation``;
    pip's isolated build environment has no torch).  ``0``: do not build it.
    Unset: build it when torch is importable, say so either way.
``KVCY_REQUIRE_EXTENSIONS=1``
    Every extension must build: no fallback (CI uses it, so that a broken
    build cannot hide behind the pure-Python twins).
``KVCY_NO_EXTENSIONS=1``
    Compile nothing.
``KVCY_CYTHON_DEBUG=1``
    ``-O0 -g`` and Cython's bounds checks; release builds are ``-O3`` with no
    debug information (``-g0``, and stripped at link time on Linux).
``KVCY_NO_CUDA=1``
    Build ``kvcy._C`` for the CPU only.
``KVCY_NO_OPENSSL=1``, ``KVCY_NO_LIBXXHASH=1``
    Do not link libcrypto / libxxhash into the compiled hasher even when their
    headers are found (it then uses hashlib / the xxhash package).
``KVCY_BUILD_ONLY=name[,name]``
    Build only these extensions (development:
    ``KVCY_BUILD_ONLY=kvcy._fast._hashing_c python setup.py build_ext --inplace``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _setuptools_build_ext

HERE = Path(__file__).parent.resolve()


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


REQUIRE_EXTENSIONS = _flag("KVCY_REQUIRE_EXTENSIONS")
NO_EXTENSIONS = _flag("KVCY_NO_EXTENSIONS")
CYTHON_DEBUG = _flag("KVCY_CYTHON_DEBUG")
TORCH_EXTENSION = "kvcy._C"


def _build_torch_choice() -> bool | None:
    """``KVCY_BUILD_TORCH``: True (required), False (skip) or None (when importable)."""
    value = os.environ.get("KVCY_BUILD_TORCH", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"kvcy: KVCY_BUILD_TORCH must be 1, 0 or unset, got {value!r}")


BUILD_TORCH = _build_torch_choice()
if BUILD_TORCH and NO_EXTENSIONS:
    raise SystemExit("kvcy: KVCY_BUILD_TORCH=1 and KVCY_NO_EXTENSIONS=1 contradict each other")


def _release_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags): optimised without debug information, or a debug build."""
    if sys.platform == "win32":
        return (["/Od", "/Zi"] if CYTHON_DEBUG else ["/O2"]), []
    if CYTHON_DEBUG:
        return ["-O0", "-g"], []
    # Python's own CFLAGS carry -g; -g0 after them wins.  -s strips the symbol
    # table too (the module's PyInit_* stays in the dynamic symbol table).
    return ["-O3", "-g0"], (["-s"] if sys.platform.startswith("linux") else [])


COMPILE_FLAGS, LINK_FLAGS = _release_flags()


def _has_header(name: str) -> bool:
    """True when ``name`` is found in the usual system include folders."""
    roots = [sysconfig.get_paths()["include"], "/usr/include", "/usr/local/include"]
    roots += [p for p in os.environ.get("CPATH", "").split(os.pathsep) if p]
    return any(Path(r, name).exists() for r in roots)


def _hashing_build_options() -> dict:
    """Link OpenSSL's libcrypto (SHA-256) and libxxhash (XXH3) when found."""
    macros = []
    libraries = []
    if not _flag("KVCY_NO_OPENSSL") and _has_header("openssl/sha.h"):
        macros.append(("KVCY_HAVE_OPENSSL", "1"))
        libraries.append("crypto")
    if not _flag("KVCY_NO_LIBXXHASH") and _has_header("xxhash.h"):
        macros.append(("KVCY_HAVE_XXHASH", "1"))
        libraries.append("xxhash")
    headers = ["kvcy/_fast/_hashing_enc.h", "kvcy/_fast/_hashing_digest.h"]
    return {"define_macros": macros, "libraries": libraries, "depends": headers}


def _included_sources(folder: str) -> list[str]:
    """The ``.pyx`` / ``.pxd`` files a twin ``include``s from ``folder`` (a change rebuilds it)."""
    return sorted(str(p.relative_to(HERE)) for ext in ("pyx", "pxd") for p in (HERE / folder).glob(f"*.{ext}"))


# One entry per Cython twin: module name -> extra Extension keyword arguments.
# Only these are compiled: kvcy/_fast/kv_cache_c/*.pyx are pieces of
# kvcy._fast._kv_cache_c (Cython ``include``s them), listed as its depends;
# kvcy/_fast/offload_c/*.pyx likewise of kvcy._fast._offload_c.
CYTHON_MODULES: dict[str, dict] = {
    "kvcy._fast._kv_cache_c": {"depends": _included_sources("kvcy/_fast/kv_cache_c")},
    "kvcy._fast._hashing_c": _hashing_build_options(),
    "kvcy._fast._offload_c": {"depends": _included_sources("kvcy/_fast/offload_c")},
    "kvcy._fast._kv_index_c": {"depends": ["kvcy/_fast/_kv_index.h"]},
    "kvcy._fast._block_table_c": {},
}

CYTHON_DIRECTIVES = {
    "language_level": "3",
    "boundscheck": CYTHON_DEBUG,
    "wraparound": CYTHON_DEBUG,
    "initializedcheck": CYTHON_DEBUG,
    "cdivision": not CYTHON_DEBUG,
    "embedsignature": True,
    # No generated pickling: Cython's __setstate_cython__ reads its state tuple
    # unchecked (bounds checks are off), so obj.__setstate__(()) crashed the
    # interpreter, and a crafted state could set fields out of step with each
    # other.  A class that pickles says how in its own __reduce__.
    "auto_pickle": False,
}


def _cython_extensions() -> list[Extension]:
    """The Cython twins, with ``.pyx`` sources: ``KvcyBuildExt`` cythonizes at build time.

    Cythonizing there, not here, keeps generated C out of the sdist and the
    wheel and leaves each Extension's ``optional`` flag as set here.
    """
    if NO_EXTENSIONS:
        print("kvcy: KVCY_NO_EXTENSIONS set, building pure Python only")
        return []
    if importlib.util.find_spec("Cython") is None:
        if REQUIRE_EXTENSIONS:
            raise SystemExit("kvcy: KVCY_REQUIRE_EXTENSIONS=1 but Cython is not importable")
        print("kvcy: Cython not available, building pure Python only")
        return []
    exts = []
    for name, extra in CYTHON_MODULES.items():
        src = name.replace(".", "/") + ".pyx"
        if not (HERE / src).exists():
            if REQUIRE_EXTENSIONS:
                raise FileNotFoundError(src)
            continue
        exts.append(
            Extension(
                name,
                [src],
                extra_compile_args=list(COMPILE_FLAGS),
                extra_link_args=list(LINK_FLAGS),
                optional=not REQUIRE_EXTENSIONS,
                **extra,
            )
        )
    return exts


def _torch_extensions() -> tuple[list[Extension], type | None]:
    """``kvcy._C`` and torch's build_ext class; nothing when it is not to be built."""
    if NO_EXTENSIONS or BUILD_TORCH is False:
        print("kvcy: kvcy._C not requested; kvcy.ops will use the plain-torch reference ops")
        return [], None
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as exc:
        if BUILD_TORCH or REQUIRE_EXTENSIONS:
            raise SystemExit(
                f"kvcy: KVCY_BUILD_TORCH=1 or KVCY_REQUIRE_EXTENSIONS=1, but torch is not importable "
                f"in the build environment ({exc}). Install torch first and build without pip's "
                "build isolation: pip install torch && KVCY_BUILD_TORCH=1 pip install --no-build-isolation ."
            ) from exc
        print(
            "kvcy: torch is not importable in the build environment (pip's build isolation?): "
            "kvcy._C not built, kvcy.ops will use the plain-torch reference ops. "
            "To build it: pip install torch && KVCY_BUILD_TORCH=1 pip install --no-build-isolation ."
        )
        return [], None
    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "cuda_ext").glob("*.cpp"))
    if not sources:
        if BUILD_TORCH or REQUIRE_EXTENSIONS:
            raise SystemExit("kvcy: no cuda_ext/*.cpp sources to build kvcy._C from")
        return [], None
    cuda_sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "cuda_ext").glob("*.cu"))
    use_cuda = (
        bool(cuda_sources)
        and torch.version.cuda is not None
        and cpp_extension.CUDA_HOME is not None
        and shutil.which("nvcc") is not None
        and not _flag("KVCY_NO_CUDA")
    )
    cxx_flags = [*COMPILE_FLAGS, "-std=c++17"]
    depends = sorted(str(p.relative_to(HERE)) for p in (HERE / "cuda_ext").glob("*.h"))
    if use_cuda:
        print(f"kvcy: kvcy._C is to be built against torch {torch.__version__}, with CUDA")
        ext = cpp_extension.CUDAExtension(
            TORCH_EXTENSION,
            sources + cuda_sources,
            define_macros=[("KVCY_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "-std=c++17"]},
            extra_link_args=list(LINK_FLAGS),
            depends=depends,
        )
    else:
        print(f"kvcy: kvcy._C is to be built against torch {torch.__version__}, CPU only")
        ext = cpp_extension.CppExtension(
            TORCH_EXTENSION,
            sources,
            extra_compile_args=cxx_flags,
            extra_link_args=list(LINK_FLAGS),
            depends=depends,
        )
    ext.optional = not (REQUIRE_EXTENSIONS or BUILD_TORCH)
    return [ext], cpp_extension.BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)


_torch_exts, _torch_build_ext = _torch_extensions()
# torch's build_ext (compiler wrappers, ninja) when kvcy._C is to be built, setuptools' otherwise.
_BuildExtBase: type = _torch_build_ext or _setuptools_build_ext


class KvcyBuildExt(_BuildExtBase):  # type: ignore[misc, valid-type]
    """build_ext that cythonizes at build time, falls back without a compiler and says what it built."""

    def _compiles(self, suffix: str, code: str) -> str | None:
        """None when ``self.compiler`` compiles and links ``code``; else why not."""
        with tempfile.TemporaryDirectory(prefix="kvcy-probe-") as tmp:
            src = Path(tmp, "probe" + suffix)
            src.write_text(code)
            try:
                objs = self.compiler.compile([str(src)], output_dir=tmp)
                self.compiler.link_shared_object(objs, str(Path(tmp, "probe.so")), target_lang=(
                    "c++" if suffix == ".cpp" else "c"))
            except Exception as exc:  # any failure means: no usable compiler
                lines = str(exc).splitlines() or [""]
                return f"{type(exc).__name__}: {lines[0][:200]}"
        return None

    def _drop(self, names: set[str], why: str) -> None:
        optional = [e.name for e in self.extensions if e.name in names and not getattr(e, "optional", False)]
        if optional:
            raise SystemExit(f"kvcy: cannot build {', '.join(optional)}: {why}")
        self.extensions = [e for e in self.extensions if e.name not in names]
        self._kvcy_skipped.extend((n, why) for n in sorted(names))

    def build_extensions(self) -> None:
        names = {e.name for e in self.extensions}
        if self.extensions and sys.platform != "win32":
            why = self._compiles(".c", "int kvcy_probe(void) { return 0; }\n")
            if why:
                self._drop(names, f"no working C compiler ({why})")
            elif TORCH_EXTENSION in names:
                why = self._compiles(".cpp", "int kvcy_probe() { return 0; }\n")
                if why:
                    self._drop({TORCH_EXTENSION}, f"no working C++ compiler ({why})")
        if not self.extensions:
            return
        if _torch_build_ext is not None and not any(e.name == TORCH_EXTENSION for e in self.extensions):
            # kvcy._C is not in this build: skip torch's compiler checks and flags.
            _setuptools_build_ext.build_extensions(self)
        else:
            super().build_extensions()

    def build_extension(self, ext: Extension) -> None:
        if any(str(s).endswith(".pyx") for s in ext.sources):
            from Cython.Build import cythonize

            ext.sources = cythonize([ext], compiler_directives=CYTHON_DIRECTIVES, quiet=True)[0].sources
        super().build_extension(ext)  # an optional extension's failure is caught and reported above us
        self._kvcy_built.append(ext.name)

    def run(self) -> None:
        self._kvcy_built: list[str] = []
        self._kvcy_skipped: list[tuple[str, str]] = []
        requested = [e.name for e in self.extensions]
        super().run()
        print(f"kvcy: compiled extensions: {', '.join(sorted(self._kvcy_built)) or 'none'}")
        failed = [n for n in requested if n not in self._kvcy_built]
        if failed:
            print("kvcy: NOT compiled (the pure-Python twins / plain-torch reference ops are used instead):")
            reasons: dict[str, list[str]] = {}
            skipped = dict(self._kvcy_skipped)
            for name in failed:
                reasons.setdefault(skipped.get(name, "build failed, see the errors above"), []).append(name)
            for why, which in reasons.items():
                print(f"kvcy:   {', '.join(which)}: {why}")


_all_exts = _cython_extensions() + _torch_exts
_only = [n for n in os.environ.get("KVCY_BUILD_ONLY", "").split(",") if n]
if _only:
    _all_exts = [e for e in _all_exts if e.name in _only]
setup(
    ext_modules=_all_exts,
    cmdclass={"build_ext": KvcyBuildExt},
)
