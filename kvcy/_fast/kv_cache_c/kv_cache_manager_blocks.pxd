# kv_cache_c/kv_cache_manager_blocks.pxd: the declarations of KVCacheBlocks: C fields and cdef/cpdef method
# signatures (implemented in kv_cache_manager_blocks.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef class KVCacheBlocks:
    cdef public tuple blocks
