# kv_cache_c/kv_cache_manager_blocks.pyx: KVCacheBlocks: the blocks per KV-cache group that allocate_slots
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


# Whether the hits a caller hands back to allocate_slots are still good: the
# blocks get_computed_blocks found may have been evicted, reused or re-keyed
# since (by other requests' allocations, frees or evictions).
cdef int _check_hits_fresh(KVCacheCoordinator coordinator, object request, str request_id,
                           tuple hit_groups) except -1:
    # (Off the hot paths: _fresh_full_hits is the fast path's.)  The
    # prefix-cache hits handed to allocate_slots still hold the prefix
    # get_computed_blocks found them for: each block (not null) is still
    # cached under the request's hash at its position, or -- with partial hits,
    # which match finer hashes -- still cached at all.  A hit that went stale
    # in between (the block evicted, reused or re-keyed by another request)
    # would give the request someone else's KV; it is refused before any change.
    cdef BlockPool pool = coordinator.block_pool
    cdef bint exact = not coordinator.enable_partial_hash_hits
    cdef object hashes = _block_hashes_of(request)
    cdef object view = None, group, block
    cdef Py_ssize_t i, n = 0
    cdef KVCacheBlock b
    cdef SingleTypeKVCacheManager manager
    for group, manager in zip(hit_groups, coordinator.single_type_managers):
        if not group:
            continue
        if exact:
            view = resolve_block_hashes(hashes, pool.hash_block_size, manager.block_size)
            n = len(view)
        i = 0
        for block in group:
            b = <KVCacheBlock?>block
            if not b.is_null:
                if exact:
                    if not (i < n and _keyed(b, view[i], <uint32_t>manager.kv_cache_group_id)):
                        _refuse_stale_hit(request_id, b.block_id, manager.kv_cache_group_id, i)
                elif b._hash is None and b.block_id not in pool._partial_keys:
                    _refuse_stale_hit(request_id, b.block_id, manager.kv_cache_group_id, i)
            i += 1
    return 0


cdef inline bint _keyed(KVCacheBlock b, object block_hash, uint32_t gid) noexcept:
    # The block is cached under block_hash in group gid (the hash object is
    # most often the very one the block was cached with).  Compared as bytes,
    # never through a Python __eq__ (a bytes subclass could define one, and
    # change the pool or the request's hashes mid-check); block hashes are
    # bytes, anything else never matches.
    if b._hash is None or b._group != gid:
        return False
    if b._hash is block_hash:
        return True
    return (isinstance(b._hash, bytes) and isinstance(block_hash, bytes)
            and kvcy_bytes_eq(<PyObject*>b._hash, <PyObject*>block_hash))


cdef int _fresh_full_hits(KVCacheManager mgr, object request, str request_id, list hashes,
                          list hit_list) except -1:
    # _check_hits_fresh for the fast path's one full-attention group, on
    # borrowed pointers: the block's hash is most often the request's own
    # object (or an equal sha256 digest, compared as words).  hashes: the
    # request's block hashes, as the fast path read them.
    cdef FullAttentionManager full = mgr._full
    cdef Py_ssize_t i, n
    cdef uint32_t gid
    cdef PyObject *bp
    cdef PyObject *kp
    cdef PyObject *hp
    if (hashes is None or full.block_size != mgr.block_pool.hash_block_size
            or mgr.coordinator.enable_partial_hash_hits or full.kv_cache_group_id > 0xFFFFFFFF):
        return _check_hits_fresh(mgr.coordinator, request, request_id, (hit_list,))
    n = PyList_GET_SIZE(<list>hashes)
    gid = <uint32_t>full.kv_cache_group_id
    for i in range(PyList_GET_SIZE(hit_list)):
        bp = _PyList_GET_ITEM_RAW(hit_list, i)
        if (<KVCacheBlock>bp).is_null:
            continue
        if i < n and (<KVCacheBlock>bp)._group == gid:
            kp = <PyObject*>(<KVCacheBlock>bp)._hash
            hp = _PyList_GET_ITEM_RAW(<list>hashes, i)
            if kp == hp:
                continue
            if Py_TYPE_RAW(kp) == &PyBytes_Type and Py_TYPE_RAW(hp) == &PyBytes_Type:
                if kvcy_bytes_eq(kp, hp):
                    continue
            elif _keyed(<KVCacheBlock>bp, <object>hp, gid):  # (runs no Python code)
                continue
        _refuse_stale_hit(request_id, (<KVCacheBlock>bp).block_id, full.kv_cache_group_id, i)
    return 0


cdef int _refuse_stale_hit(str request_id, Py_ssize_t block_id, Py_ssize_t group_id, Py_ssize_t index) except -1:
    raise ValueError(
        f"stale prefix-cache hit for request {request_id!r}: block {block_id} (group {group_id}, "
        f"position {index}) no longer holds the request's prefix (evicted, reused or re-keyed since "
        "get_computed_blocks); look the hits up again"
    )
