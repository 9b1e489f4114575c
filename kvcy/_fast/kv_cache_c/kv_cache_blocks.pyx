# kv_cache_c/kv_cache_blocks.pyx: KVCacheBlocks: the blocks per KV-cache group that allocate_slots
# and get_computed_blocks return.  (vLLM: vllm/v1/core/kv_cache_manager.py, KVCacheBlocks.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

# (freelist stays on the definition: Cython does not take it from the .pxd.)
@cython.freelist(32)
cdef class KVCacheBlocks:
    """Blocks per KV-cache group: what allocate_slots / get_computed_blocks return.

    ``blocks[i][j]`` is the j-th block of group i.
    """

    def __init__(self, blocks):
        if type(blocks) is list:  # (vLLM takes any sequence of groups; kept here as a tuple)
            blocks = tuple(blocks)
        elif blocks is not None and type(blocks) is not tuple:
            raise TypeError(f"Argument 'blocks' has incorrect type (expected tuple, got {type(blocks).__name__})")
        self.blocks = blocks

    def __add__(self, other):
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented       # (then Python's TypeError: unsupported operand)
        return KVCacheBlocks(tuple([list(a) + list(b) for a, b in zip(self.blocks, (<KVCacheBlocks>other).blocks)]))

    def __eq__(self, other):
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return self.get_block_ids() == other.get_block_ids()

    __hash__ = None

    def get_block_ids(self, allow_none=False, *, group_ids=None):
        """Block ids per group: all groups, or those in ``group_ids`` in that order
        (``None`` with ``allow_none`` when every one of them is empty)."""
        cdef object group, blk
        cdef list ids
        groups = self.blocks if group_ids is None else tuple([self.blocks[i] for i in group_ids])
        if allow_none and all(len(g) == 0 for g in groups):
            return None
        out = []
        for group in groups:
            ids = []
            for blk in group:  # (blocks is public: a None would be read as a block)
                if not _is_block(<PyObject*>blk):
                    raise TypeError(f"blocks must be KVCacheBlock, got {type(blk).__name__}")
                ids.append((<KVCacheBlock>blk).block_id)
            out.append(ids)
        return tuple(out)

    def get_unhashed_block_ids(self):
        """Ids of the one group's blocks that are not cached (asserts a single group, as vLLM does)."""
        assert len(self.blocks) == 1, "Only one group is supported"
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self):
        """Ids of each group's blocks that are not cached, leaving out null blocks."""
        return [[b.block_id for b in group if b.block_hash is None and not b.is_null] for group in self.blocks]

    def new_empty(self):
        return KVCacheBlocks(tuple([() for _ in range(len(self.blocks))]))

    def __repr__(self):
        return f"KVCacheBlocks({self.get_block_ids()})"


cdef inline KVCacheBlocks _one_group(list blocks):
    # KVCacheBlocks((blocks,)) without a call through the type.
    cdef KVCacheBlocks out = KVCacheBlocks.__new__(KVCacheBlocks)
    out.blocks = (blocks,)
    return out
