"""Argument checks and config readers shared by the spec classes (private)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(a // -b)


def _check_int(owner: str, name: str, value: Any, *, minimum: int = 1, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{owner}.{name} must be {what}, got {value}")


def _check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be a bool, got {type(value).__name__}: {value!r}")


def _check_tokens_per_state(owner: str, value: Any) -> None:
    if isinstance(value, Fraction):
        if value <= 0:
            raise ValueError(f"{owner}.tokens_per_state must be positive, got {value}")
        return
    _check_int(owner, "tokens_per_state", value)


def _dcp_world_size(config: Any) -> int:
    """``parallel_config.decode_context_parallel_size`` of a vLLM-style config (1 if absent)."""
    parallel = getattr(config, "parallel_config", None)
    return getattr(parallel, "decode_context_parallel_size", 1) or 1


def _kv_shard_count(spec: Any, config: Any) -> int:
    """How many decode-context-parallel ranks split ``spec``'s tokens: the dcp world
    size for a sharded cache, 1 for one every rank replicates (``dcp_sharded=False``)."""
    return _dcp_world_size(config) if spec.dcp_sharded else 1


def _setting(config: Any, name: str, nested: str) -> Any:
    """Read ``name`` from a kvcy settings object or from a vLLM-style nested config."""
    if hasattr(config, name):
        return getattr(config, name)
    return getattr(getattr(config, nested), name)


def _admission_capped_bytes(spec: Any, config: Any) -> int:
    """Memory one request can hold for a spec whose blocks are capped per
    request (``max_admission_blocks_per_request``): sliding window, chunked local."""
    blocks = spec.max_admission_blocks_per_request(
        max_in_flight_tokens=_setting(config, "max_num_batched_tokens", "scheduler_config"),
        max_model_len=_setting(config, "max_model_len", "model_config"),
    )
    return blocks * spec.page_size_bytes
