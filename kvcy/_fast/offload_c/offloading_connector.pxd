# offload_c/offloading_connector.pxd: the declarations of ConnectorRequest and ReplayConnector (implemented in
# offloading_connector.pyx).  Included by kvcy/_fast/_offload_c.pxd.

@cython.final
cdef class ConnectorRequest:
    cdef object _ctx              # its ReqContext
    cdef int64_t _index           # its index in the decision list
    cdef Py_ssize_t _prompt_blocks
    cdef list _keys               # its offload keys, made so far
    cdef Py_ssize_t _next_stored  # the first prompt block not offered yet
    cdef object _req              # the Request of its last lookup (num_computed_tokens), or None
    cdef Py_ssize_t _hit_first    # the last lookup's hit: keys[_hit_first:_hit_first + _hits]
    cdef Py_ssize_t _hits


@cython.final
cdef class ReplayConnector:
    cdef object _manager
    cdef Py_ssize_t _block_size
    cdef bytes _suffix
    cdef list _ends               # _ends[i]: the end-token position of block i, (i + 1) * block_size
    # the manager's methods, bound once
    cdef object _count_hits
    cdef object _prepare_load
    cdef object _prepare_store
    cdef object _complete_store
    cdef object _complete_load
    cdef object _on_request_finished
    # this step's jobs, completed at its end: requests and their keys, side by side
    cdef list _load_reqs
    cdef list _load_keys
    cdef list _store_reqs
    cdef list _store_keys
    cdef list _finishing
    cdef list _finished
    cdef Py_ssize_t _hit_blocks
    cdef Py_ssize_t _blocks_loaded
    cdef Py_ssize_t _blocks_stored
    cdef Py_ssize_t _evictions
    cdef Py_ssize_t _stores_refused

    cdef int _make_keys(self, ConnectorRequest st, list block_hashes, Py_ssize_t n) except -1
    cdef int _offer(self, ConnectorRequest st, Py_ssize_t end, list dec) except -1
    cdef int _end_previous(self, list dec) except -1
