"""Element types without torch: canonical names and sizes of a spec's ``dtype``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

# canonical name (the torch attribute) -> size in bytes
_DTYPE_SIZES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
}

# other spellings -> canonical name.  The ``fp8*`` entries are vLLM cache-dtype
# names; a KV cache in fp8 stores one byte per element.
_DTYPE_ALIASES: dict[str, str] = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "double": "float64",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "fp8_inc": "float8_e4m3fn",
    "fp8_ds_mla": "uint8",
    "nvfp4": "uint8",
    "int8_per_token_head": "int8",
    "fp8_per_token_head": "float8_e4m3fn",
}


def canonical_dtype(dtype: Any) -> str:
    """Canonical name of a dtype given as a ``torch.dtype`` or a string.

    Raises:
        ValueError: the name is not a known dtype.
        TypeError: ``dtype`` is neither a string nor a ``torch.dtype``.
    """
    if isinstance(dtype, str):
        name = dtype.strip().lower()
        name = name.removeprefix("torch.")
        name = _DTYPE_ALIASES.get(name, name)
        if name not in _DTYPE_SIZES:
            raise ValueError(
                f"unknown dtype {dtype!r}; expected a torch.dtype or one of "
                f"{sorted(set(_DTYPE_SIZES) | set(_DTYPE_ALIASES))}"
            )
        return name
    if _is_torch_dtype(dtype):
        name = str(dtype).removeprefix("torch.")
        if name not in _DTYPE_SIZES:
            itemsize = getattr(dtype, "itemsize", None)
            if not isinstance(itemsize, int) or itemsize <= 0:
                raise ValueError(f"dtype {dtype} has no whole-byte element size")
            _DTYPE_SIZES[name] = itemsize
        return name
    raise TypeError(f"dtype must be a torch.dtype or a string, got {type(dtype).__name__}: {dtype!r}")


def _is_torch_dtype(dtype: Any) -> bool:
    return type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch"


def get_dtype_size(dtype: Any) -> int:
    """Size in bytes of one element of ``dtype`` (a ``torch.dtype`` or a name)."""
    return _DTYPE_SIZES[canonical_dtype(dtype)]


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)
