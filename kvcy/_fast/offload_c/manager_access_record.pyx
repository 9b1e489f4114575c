# offload_c/manager_access_record.pyx: what one request did with one manager (the keys it loaded or
# offered, with flags), kept on its ReqContext.  (vLLM: _RequestCacheAccess in
# vllm/v1/kv_offload/cpu/manager.py.)
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

cdef class _AccessRecord:
    """What one request did with one manager, since the manager's last reset."""

    def __cinit__(self):
        self.keys = {}
        self.inserted_log = []

    cdef int fold(self) except -1:
        """Move the logged insertions into the flags (each key is in ``keys``)."""
        cdef PyObject *f
        if self.inserted_log:
            for key in self.inserted_log:
                f = _map_get(self.keys, key)
                self.keys[key] = (0 if f == NULL else <Py_ssize_t><object>f) | _INSERTED
            self.inserted_log = []
        return 0


cdef class _AccessRecords:
    """Kept on a ReqContext: manager owner id -> its _AccessRecord for the request."""

    def __cinit__(self):
        self.records = {}
