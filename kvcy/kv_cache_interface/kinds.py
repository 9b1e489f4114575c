"""Spec kinds as KV events publish them: :class:`KVCacheSpecKind`."""

from __future__ import annotations

from enum import Enum

from kvcy.kv_cache_interface.base import KVCacheSpec
from kvcy.kv_cache_interface.chunked_local import ChunkedLocalAttentionSpec
from kvcy.kv_cache_interface.encoder_attention import CrossAttentionSpec, EncoderOnlyAttentionSpec
from kvcy.kv_cache_interface.full_attention import FullAttentionSpec, SinkFullAttentionSpec
from kvcy.kv_cache_interface.mamba import MambaSpec
from kvcy.kv_cache_interface.mla import MLAAttentionSpec, SlidingWindowMLASpec
from kvcy.kv_cache_interface.sliding_window import SlidingWindowSpec
from kvcy.kv_cache_interface.uniform import UniformTypeKVCacheSpecs


class KVCacheSpecKind(str, Enum):
    """The kind of a group's spec, as KV events publish it (``kv_cache_spec_kind``)."""

    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    MAMBA = "mamba"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    SINK_FULL_ATTENTION = "sink_full_attention"
    ENCODER_ONLY_ATTENTION = "encoder_only_attention"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


# Spec class -> kind, most specific first (subclasses before their bases).
_SPEC_KINDS: tuple[tuple[type, KVCacheSpecKind], ...] = (
    (SlidingWindowMLASpec, KVCacheSpecKind.SLIDING_WINDOW_MLA),
    (MLAAttentionSpec, KVCacheSpecKind.MLA_ATTENTION),
    (SinkFullAttentionSpec, KVCacheSpecKind.SINK_FULL_ATTENTION),
    (FullAttentionSpec, KVCacheSpecKind.FULL_ATTENTION),
    (ChunkedLocalAttentionSpec, KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION),
    (SlidingWindowSpec, KVCacheSpecKind.SLIDING_WINDOW),
    (MambaSpec, KVCacheSpecKind.MAMBA),
    (EncoderOnlyAttentionSpec, KVCacheSpecKind.ENCODER_ONLY_ATTENTION),
    (CrossAttentionSpec, KVCacheSpecKind.CROSS_ATTENTION),
)


def get_kv_cache_spec_kind(kv_cache_spec: KVCacheSpec) -> KVCacheSpecKind:
    """The :class:`KVCacheSpecKind` of a spec (most specific class wins).

    A :class:`UniformTypeKVCacheSpecs` has its layers' kind when they all
    share one, else ``UNKNOWN``.
    """
    if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
        kinds = {get_kv_cache_spec_kind(s) for s in kv_cache_spec.kv_cache_specs.values()}
        return next(iter(kinds)) if len(kinds) == 1 else KVCacheSpecKind.UNKNOWN
    for spec_class, kind in _SPEC_KINDS:
        if isinstance(kv_cache_spec, spec_class):
            return kind
    return KVCacheSpecKind.UNKNOWN


def get_kv_cache_spec_sliding_window(kv_cache_spec: KVCacheSpec) -> int | None:
    """The window of a sliding-window spec, else None.

    A full-attention spec that merely records a window (hybrid manager off)
    gives None: its blocks are managed as full attention.
    """
    if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
        windows = {get_kv_cache_spec_sliding_window(s) for s in kv_cache_spec.kv_cache_specs.values()}
        return next(iter(windows)) if len(windows) == 1 else None
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return kv_cache_spec.sliding_window
    return None
