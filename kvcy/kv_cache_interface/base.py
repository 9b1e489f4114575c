"""The base of every spec: :class:`KVCacheSpec`, its block-stride alignment
:class:`MultipleOf`, and :func:`num_states_for`."""

from __future__ import annotations

import copy
from collections.abc import Collection
from dataclasses import dataclass, field, fields, replace
from math import gcd
from typing import Any, TypeVar

from kvcy.kv_cache_interface._checks import _check_bool, _check_int, _check_tokens_per_state, cdiv


@dataclass(frozen=True)
class MultipleOf:
    """A block-stride alignment of whole kernel blocks of up to ``base`` tokens.

    Given as a spec's ``block_stride_alignment`` when the attention backend
    splits each KV-cache block into kernel blocks: the stride between physical
    blocks must then be a whole number of kernel-block pages (see
    :meth:`KVCacheSpec.get_block_stride_alignment`).
    """

    base: int

    def __post_init__(self) -> None:
        _check_int("MultipleOf", "base", self.base)

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """What one layer stores per KV-cache block.

    Subclasses give the page size (bytes per block) and the worst-case memory
    one request can hold.  The standard vocabulary of the logical cache shape
    ``[B, H, N, C]`` is exposed as properties: :attr:`num_heads` (``H``; 1 for
    head-less formats such as MLA), :attr:`tokens_per_state` (-1 for recurrent
    state, 1 for standard attention, more for compressed formats) and
    :attr:`state_content_size_bytes` (``C`` in bytes, per state and head).
    """

    block_size: int
    """Number of tokens in a block."""
    dcp_sharded: bool = False
    """Whether decode context parallelism shards this cache's tokens across ranks
    (each rank holds 1/dcp of them; False means every rank holds a full copy)."""
    block_stride_alignment: int | MultipleOf | None = None
    """Byte alignment the stride between physical blocks needs (packed layers
    included): an int of bytes, :class:`MultipleOf` for whole kernel blocks,
    or None for none.  See :meth:`get_block_stride_alignment`."""
    is_draft: bool = field(default=False, compare=False)
    """Whether a draft model owns the layer; never part of equality."""

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _check_int(owner, "block_size", self.block_size)
        _check_bool(owner, "dcp_sharded", self.dcp_sharded)
        _check_bool(owner, "is_draft", self.is_draft)
        alignment = self.block_stride_alignment
        if not isinstance(alignment, MultipleOf):
            if alignment is not None and (isinstance(alignment, bool) or not isinstance(alignment, int)):
                raise TypeError(
                    f"{owner}.block_stride_alignment must be an int, a MultipleOf or None, "
                    f"got {type(alignment).__name__}: {alignment!r}"
                )
            _check_int(owner, "block_stride_alignment", alignment, optional=True)

    def get_block_stride_alignment(self) -> int:
        """Bytes the stride between physical blocks must be a multiple of.

        An int alignment is returned as is (1 for None).  For ``MultipleOf(n)``
        the kernel block is ``gcd(n, block_size)`` tokens: 1 when that is the
        whole block, else the page size of a copy of this spec with the kernel
        block size (the spec's own fields, ``page_size_padded`` included, kept).
        """
        alignment = self.block_stride_alignment
        if not isinstance(alignment, MultipleOf):
            return alignment or 1
        kernel_block_size = gcd(alignment.base, self.block_size)
        if kernel_block_size == self.block_size:
            return 1
        return replace(self, block_size=kernel_block_size).page_size_bytes

    @property
    def block_table_token_alignment(self) -> int | None:
        """Token granularity a block table row is padded to (None: not padded)."""
        return 128

    def get_num_kernel_states(self, kernel_block_size: int) -> int:
        """States in one kernel block of ``kernel_block_size`` tokens (1 for recurrent state)."""
        _check_int(type(self).__name__, "kernel_block_size", kernel_block_size)
        if self.tokens_per_state > 0:
            return int(kernel_block_size // self.tokens_per_state)
        return 1

    @property
    def prefix_cacheable(self) -> bool:
        """Whether this spec's group takes part in prefix caching."""
        return True

    @property
    def prefix_replay_tokens(self) -> int:
        """Tokens a prefix hit must replay (bounded replay: a sliding-window MLA spec's
        window); 0 for every other spec."""
        return 0

    @property
    def has_layer_views(self) -> bool:
        """Whether generic allocation makes per-layer ``[B, H, N, C]`` views of this spec."""
        return True

    @property
    def uses_slot_mapping(self) -> bool:
        """Whether the worker computes a per-token slot mapping for this spec."""
        return True

    @property
    def num_states(self) -> int:
        """States (``N``) in one block."""
        return num_states_for(self.block_size, self.tokens_per_state)

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        """Block-table entries one request needs for ``max_len`` tokens.

        Args:
            config: a :class:`kvcy.config.KVCacheSettings` or a vLLM-style config.
            max_len: the longest sequence to size for (encoder length included
                for encoder-decoder models).
        """
        return cdiv(max_len, self.block_size)

    @property
    def num_heads(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no num_heads")

    @property
    def tokens_per_state(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no tokens_per_state")

    @property
    def state_content_size_bytes(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no state_content_size_bytes")

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block (``block_size`` tokens) of this layer."""
        raise NotImplementedError(f"{type(self).__name__} has no page size")

    def max_memory_usage_bytes(self, config: Any) -> int:
        """Most bytes one request can make this layer hold.

        Args:
            config: a :class:`kvcy.config.KVCacheSettings` (or anything with
                ``max_model_len``, ``max_num_batched_tokens``,
                ``max_num_encoder_input_tokens`` and ``cache_config``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no max_memory_usage_bytes")

    def copy_with_new_block_size(self, block_size: int):
        """This spec with another block size."""
        return replace(self, block_size=block_size)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Whether every spec of ``kv_cache_specs`` may share a group with this one.

        By default: each is an instance of the class this spec's registration
        groups with (:meth:`KVCacheSpecRegistry.get_uniform_type_base_spec`);
        spec kinds with parameters (windows, chunks, Mamba state) compare those too.

        Raises:
            AssertionError: this spec's class is not registered (as in vLLM).
        """
        from kvcy.kv_cache_interface.registry import KVCacheSpecRegistry

        base = KVCacheSpecRegistry.get_uniform_type_base_spec(self)
        assert base is not None, (
            f"Unsupported KV cache spec type: {type(self)}. "
            "Please register it using @register_kv_cache_spec decorator."
        )
        return all(isinstance(spec, base) for spec in kv_cache_specs.values())

    @classmethod
    def merge(cls, specs: list):
        """One spec standing for several layers that must all be equal.

        Raises:
            ValueError: ``specs`` is empty.
            AssertionError: its members differ (as in vLLM).
        """
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if any(spec != specs[0] for spec in specs[1:]):
            raise AssertionError("All layers in the same KV cache group must have the same KV cache spec.")
        return copy.deepcopy(specs[0])


def num_states_for(block_size: int, tokens_per_state: int) -> int:
    """States (``N``) in a block of ``block_size`` tokens; 1 for recurrent state (-1).

    Raises:
        ValueError: non-positive block size, or tokens_per_state that is
            neither -1 nor a positive divisor of block_size.
    """
    _check_int("num_states_for", "block_size", block_size)
    if tokens_per_state == -1:
        return 1
    _check_tokens_per_state("num_states_for", tokens_per_state)
    if block_size % tokens_per_state:
        raise ValueError(f"block_size {block_size} is not a multiple of tokens_per_state {tokens_per_state}")
    return int(block_size // tokens_per_state)


_SpecT = TypeVar("_SpecT", bound=KVCacheSpec)


def replace_as(spec: KVCacheSpec, target_cls: type[_SpecT], *, drop: Collection[str] = (), **changes: Any) -> _SpecT:
    """``dataclasses.replace`` into another spec class (e.g. a sliding-window spec
    rebuilt as full attention).

    Every init field of ``spec`` is passed on unless named in ``drop``; fields
    only ``target_cls`` has keep their defaults; ``changes`` override.

    Raises:
        TypeError: ``target_cls`` has no field of that name (as in vLLM).
    """
    kwargs = {f.name: getattr(spec, f.name) for f in fields(spec) if f.init and f.name not in drop}
    kwargs.update(changes)
    return target_cls(**kwargs)
