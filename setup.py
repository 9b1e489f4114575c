"""Build script for kvcy.

Two kinds of compiled code:

* Cython twins of the hot paths (``kvcy/_fast/_<thing>_c.pyx``), listed in
  ``CYTHON_MODULES``.  They are optional: with no compiler, or no Cython, the
  pure-Python twins are used.  ``KVCY_REQUIRE_EXTENSIONS=1`` turns a failed
  build into an error (CI uses it so that a broken build cannot hide).
* A torch C++/CUDA extension (``cuda_ext/`` -> ``kvcy._C``), built only when
  torch is importable in the build environment; its CUDA sources only when
  torch has CUDA and nvcc is found.  Install with ``--no-build-isolation`` so
  the build sees the torch you already have.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent.resolve()
REQUIRE_EXTENSIONS = os.environ.get("KVCY_REQUIRE_EXTENSIONS", "") not in ("", "0")
NO_EXTENSIONS = os.environ.get("KVCY_NO_EXTENSIONS", "") not in ("", "0")
CYTHON_DEBUG = os.environ.get("KVCY_CYTHON_DEBUG", "") not in ("", "0")


def _has_header(name: str) -> bool:
    """True when ``name`` is found in the usual system include folders."""
    roots = [sysconfig.get_paths()["include"], "/usr/include", "/usr/local/include"]
    roots += [p for p in os.environ.get("CPATH", "").split(os.pathsep) if p]
    return any(Path(r, name).exists() for r in roots)


def _hashing_build_options() -> dict:
    """Link OpenSSL's libcrypto (SHA-256) and libxxhash (XXH3) when found."""
    macros = []
    libraries = []
    if os.environ.get("KVCY_NO_OPENSSL", "") in ("", "0") and _has_header("openssl/sha.h"):
        macros.append(("KVCY_HAVE_OPENSSL", "1"))
        libraries.append("crypto")
    if os.environ.get("KVCY_NO_LIBXXHASH", "") in ("", "0") and _has_header("xxhash.h"):
        macros.append(("KVCY_HAVE_XXHASH", "1"))
        libraries.append("xxhash")
    headers = ["kvcy/_fast/_hashing_enc.h", "kvcy/_fast/_hashing_digest.h"]
    return {"define_macros": macros, "libraries": libraries, "depends": headers}


# One entry per Cython twin: module name -> extra Extension keyword arguments.
CYTHON_MODULES: dict[str, dict] = {
    "kvcy._fast._kv_cache_c": {},
    "kvcy._fast._hashing_c": _hashing_build_options(),
    "kvcy._fast._offload_c": {},
}

CYTHON_DIRECTIVES = {
    "language_level": "3",
    "boundscheck": CYTHON_DEBUG,
    "wraparound": CYTHON_DEBUG,
    "initializedcheck": CYTHON_DEBUG,
    "cdivision": not CYTHON_DEBUG,
    "embedsignature": True,
}


def _cython_extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        print("kvcy: KVCY_NO_EXTENSIONS set, building pure Python only")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        if REQUIRE_EXTENSIONS:
            raise
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
                extra_compile_args=["-O3"] if not CYTHON_DEBUG else ["-O0", "-g"],
                optional=not REQUIRE_EXTENSIONS,
                **extra,
            )
        )
    return cythonize(exts, compiler_directives=CYTHON_DIRECTIVES, quiet=True)


def _torch_extensions() -> tuple[list[Extension], dict]:
    """The torch extension ``kvcy._C``; empty when torch is not importable."""
    if NO_EXTENSIONS or os.environ.get("KVCY_NO_TORCH_EXTENSION", "") not in ("", "0"):
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        print("kvcy: torch not importable, skipping the kvcy._C extension")
        return [], {}
    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "cuda_ext").glob("*.cpp"))
    if not sources:
        return [], {}
    cuda_sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "cuda_ext").glob("*.cu"))
    use_cuda = (
        bool(cuda_sources)
        and torch.version.cuda is not None
        and cpp_extension.CUDA_HOME is not None
        and shutil.which("nvcc") is not None
        and os.environ.get("KVCY_NO_CUDA", "") in ("", "0")
    )
    cxx_flags = ["-O3", "-std=c++17"]
    if use_cuda:
        print("kvcy: building kvcy._C with CUDA")
        ext = cpp_extension.CUDAExtension(
            "kvcy._C",
            sources + cuda_sources,
            define_macros=[("KVCY_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "-std=c++17"]},
        )
    else:
        print("kvcy: building kvcy._C for CPU only")
        ext = cpp_extension.CppExtension("kvcy._C", sources, extra_compile_args=cxx_flags)
    ext.optional = not REQUIRE_EXTENSIONS
    return [ext], {"torch_build_ext": cpp_extension.BuildExtension}


class KvcyBuildExt(build_ext):
    """build_ext that reports which build happened and tolerates optional failures."""

    def run(self):
        super().run()
        built = [e.name for e in self.extensions if Path(self.get_ext_fullpath(e.name)).exists()]
        print(f"kvcy: compiled extensions: {', '.join(built) if built else 'none (pure Python)'}")


def _cmdclass(torch_cmd: dict) -> dict:
    if "torch_build_ext" in torch_cmd:
        base = torch_cmd["torch_build_ext"]

        class TorchAwareBuildExt(base):  # type: ignore[misc, valid-type]
            def run(self):
                super().run()
                built = [
                    e.name for e in self.extensions if Path(self.get_ext_fullpath(e.name)).exists()
                ]
                print(f"kvcy: compiled extensions: {', '.join(built) if built else 'none'}")

        return {"build_ext": TorchAwareBuildExt.with_options(use_ninja=shutil.which("ninja") is not None)}
    return {"build_ext": KvcyBuildExt}


_torch_exts, _torch_cmd = _torch_extensions()
_all_exts = _cython_extensions() + _torch_exts
# KVCY_BUILD_ONLY=name[,name]: build only these extensions (for development:
# `KVCY_BUILD_ONLY=kvcy._fast._hashing_c python setup.py build_ext --inplace`).
_only = [n for n in os.environ.get("KVCY_BUILD_ONLY", "").split(",") if n]
if _only:
    _all_exts = [e for e in _all_exts if e.name in _only]
setup(
    ext_modules=_all_exts,
    cmdclass=_cmdclass(_torch_cmd),
)
