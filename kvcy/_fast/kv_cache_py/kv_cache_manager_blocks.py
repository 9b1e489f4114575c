"""Blocks per KV-cache group, as the manager hands them out (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheBlocks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcy._fast.kv_cache_py._common import _Checked, _tuple_or_none
from kvcy._fast.kv_cache_py.block_pool_block_map import _group_key, resolve_block_hashes
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock


class KVCacheBlocks(_Checked):
    """Blocks per KV-cache group: what allocate_slots / get_computed_blocks return.

    ``blocks[i][j]`` is the j-th block of group i.
    """

    __slots__ = ("blocks",)
    _RULES = {"blocks": _tuple_or_none}

    def __init__(self, blocks: tuple[Sequence[KVCacheBlock], ...] | list[Sequence[KVCacheBlock]]) -> None:
        if blocks.__class__ is list:  # (vLLM takes any sequence of groups; kept here as a tuple)
            blocks = tuple(blocks)
        elif blocks.__class__ is not tuple and blocks is not None:  # (the compiled twin's ``tuple blocks``)
            raise TypeError(f"Argument 'blocks' has incorrect type (expected tuple, got {type(blocks).__name__})")
        object.__setattr__(self, "blocks", blocks)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented  # (then Python's TypeError: unsupported operand)
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return self.get_block_ids() == other.get_block_ids()

    __hash__ = None  # type: ignore[assignment]

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        """Block ids per group: all groups, or those in ``group_ids`` in that order
        (``None`` with ``allow_none`` when every one of them is empty)."""
        groups = self.blocks if group_ids is None else tuple([self.blocks[i] for i in group_ids])
        if allow_none and all(len(g) == 0 for g in groups):
            return None
        try:
            return tuple([blk._block_id for blk in group] for group in groups)
        except AttributeError:  # (the compiled twin's refusal, found only when it happens)
            for group in groups:
                for blk in group:
                    if not isinstance(blk, KVCacheBlock):
                        raise TypeError(f"blocks must be KVCacheBlock, got {type(blk).__name__}") from None
            raise

    def get_unhashed_block_ids(self) -> list[int]:
        """Ids of the one group's blocks that are not cached (asserts a single group, as vLLM does)."""
        assert len(self.blocks) == 1, "Only one group is supported"
        return [b._block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        """Ids of each group's blocks that are not cached, leaving out null blocks."""
        return [[b.block_id for b in group if b.block_hash is None and not b.is_null] for group in self.blocks]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in range(len(self.blocks))))

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()})"


# Whether the hits a caller hands back to allocate_slots are still good: the
# blocks get_computed_blocks found may have been evicted, reused or re-keyed
# since (by other requests' allocations, frees or evictions).
def _check_hits_fresh(coordinator: Any, request: Any, request_id: str, hit_groups: tuple) -> None:
    # The prefix-cache hits handed to allocate_slots still hold the prefix
    # get_computed_blocks found them for: each block (not null) is still
    # cached under the request's hash at its position, or -- with partial hits,
    # which match finer hashes -- still cached at all.  A hit that went stale
    # in between (the block evicted, reused or re-keyed by another request)
    # would give the request someone else's KV; it is refused before any change.
    pool = coordinator.block_pool
    exact = not coordinator.enable_partial_hash_hits
    hashes = request.block_hashes
    for group, manager in zip(hit_groups, coordinator.single_type_managers):
        if not group:
            continue
        gid = manager.kv_cache_group_id
        if exact:
            view = resolve_block_hashes(hashes, pool.hash_block_size, manager.block_size)
            n = len(view)
        for i, block in enumerate(group):
            if block._is_null:
                continue
            if exact:
                if i < n and block._key == _group_key(view[i], gid):
                    continue
            elif block._key is not None or block._block_id in pool._partial_keys:
                continue
            _refuse_stale_hit(request_id, block._block_id, gid, i)


def _refuse_stale_hit(request_id: str, block_id: int, group_id: int, index: int) -> None:
    raise ValueError(
        f"stale prefix-cache hit for request {request_id!r}: block {block_id} (group {group_id}, "
        f"position {index}) no longer holds the request's prefix (evicted, reused or re-keyed since "
        "get_computed_blocks); look the hits up again"
    )
