# kv_cache_c/request.pyx: Request (the fields the KV-cache manager reads) and the fast field readers
# for compiled and other request objects.  (vLLM: vllm/v1/request.py, Request.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef tuple _KNOWN_HASHERS = ()


def _known_hashers():
    out = []
    for name in ("kvcy._fast._hashing_c", "kvcy._fast._hashing_py"):
        try:
            out.append(importlib.import_module(name).RequestBlockHasher)
        except ImportError:
            pass
    return tuple(out)


cdef class Request:
    """A request as the KV-cache manager sees it.

    The same constructor, attributes and errors as the pure-Python twin's
    ``Request``; the fields are C fields that the compiled manager reads
    without attribute lookups.  Other attributes may be set freely.

    Args:
        request_id: unique id of the request.
        prompt_token_ids: the prompt's token ids (ints that fit in 64 bits), or None
            for a prompt of embeddings only (its tokens are then zeros, as in vLLM).
        max_tokens: how many output tokens the request may produce (informative
            for a serving loop; the manager does not read it).
        lora_request: the LoRA adapter, if any (enters every block hash).
        mm_features: multimodal items sorted by placeholder offset.
        cache_salt: isolates this request's prefix cache (enters the hash of
            the block that starts at token 0).
        prompt_embeds: optional prompt embeddings (a tensor ``[num_prompt_tokens,
            hidden]``); their bytes enter the block hashes.
        block_hasher: from :func:`kvcy.hashing.get_request_block_hasher`; without
            one the request has no block hashes and never hits the cache.
        kv_cache_report_mode: ``"full"`` makes ``get_computed_blocks`` re-emit
            ``BlockStored`` events for prefix hits.
        arrival_time: free for the serving loop's use.
        skip_reading_prefix_cache: True: ``get_computed_blocks`` finds no hit
            for this request (vLLM sets it for prompt logprobs and all-token
            pooling); its blocks are still cached.  A bool.
        session_id: the streaming session the request belongs to, if any; the
            ``BlockStored`` events of its blocks carry it.

    The serving loop (the scheduler) owns these; the manager reads them and
    never writes them:

    - ``num_computed_tokens``: tokens whose KV is in the cache.  Set it to the
      hit length on admission (``get_computed_blocks``' second value) and add
      the step's scheduled tokens once the forward pass has written their KV.
      ``allocate_slots`` sizes every allocation from it: a loop that does not
      advance it gets no new blocks for decode.  0 again on preemption.
    - ``status``: a ``RequestStatus``.  ``allocate_slots`` keeps the watermark
      free while admitting a WAITING or PREEMPTED request; set RUNNING once
      admitted, PREEMPTED when preempted, a FINISHED_* one when done.
    - ``num_preemptions``: add 1 at each preemption (``record_prefix_cache_stats``
      counts the lookups of preempted requests apart).
    - ``num_in_flight_tokens``: scheduled tokens whose KV is not written yet
      (asynchronous scheduling; 0 otherwise): sliding-window groups keep
      their blocks.
    - ``shared_prefix_boundary``: vLLM's, from ``get_computed_blocks``' third
      value (0: none); sparse-retention managers read it.

    Output tokens go in through ``append_output_token_ids``, which also hashes
    the blocks they complete.
    """

    def __init__(self, request_id, prompt_token_ids, max_tokens=None, *, lora_request=None,
                 mm_features=None, cache_salt=None, prompt_embeds=None, block_hasher=None,
                 kv_cache_report_mode="incremental", arrival_time=0.0, skip_reading_prefix_cache=False,
                 session_id=None):
        global _KNOWN_HASHERS
        prompt, features = check_request_args(
            request_id, prompt_token_ids, max_tokens, mm_features, cache_salt, prompt_embeds,
            kv_cache_report_mode, session_id, skip_reading_prefix_cache,
        )

        self.request_id = request_id
        self.prompt_token_ids = None if prompt_token_ids is None else prompt  # (None: embeddings only, as vLLM)
        self.max_tokens = max_tokens
        self.lora_request = lora_request
        self.mm_features = features
        self.cache_salt = cache_salt
        self.prompt_embeds = prompt_embeds
        self.kv_cache_report_mode = kv_cache_report_mode
        self.arrival_time = arrival_time
        self._skip_reading_prefix_cache = skip_reading_prefix_cache
        self.session_id = session_id

        self.status = _WAITING
        self._num_computed_tokens = 0
        self._num_in_flight_tokens = 0
        self._num_preemptions = 0
        self._shared_prefix_boundary = 0
        self.num_prompt_tokens = len(prompt)
        self._spec_token_ids = []
        self._output_token_ids = []
        self._all_token_ids = list(prompt)

        self._block_hashes = []
        self._block_hasher = block_hasher
        self._hash_block_size = 0
        if block_hasher is not None:
            if not _KNOWN_HASHERS:
                _KNOWN_HASHERS = _known_hashers()
            if isinstance(block_hasher, _KNOWN_HASHERS):
                self._hash_block_size = block_hasher.block_size
            self._block_hashes.extend(block_hasher(self))

    # ------------------------------------------------------------------ checked fields
    @property
    def num_computed_tokens(self):
        """Tokens whose KV is in the cache; the serving loop advances it each step
        and sets it to 0 on preemption (see the class docstring)."""
        return self._num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, value):
        self._num_computed_tokens = _check_count("num_computed_tokens", value)

    @property
    def num_in_flight_tokens(self):
        """Scheduled tokens whose KV is not written yet (asynchronous scheduling; 0 otherwise)."""
        return self._num_in_flight_tokens

    @num_in_flight_tokens.setter
    def num_in_flight_tokens(self, value):
        self._num_in_flight_tokens = _check_count("num_in_flight_tokens", value)

    @property
    def num_preemptions(self):
        """How many times the request was preempted; the serving loop adds 1 at each."""
        return self._num_preemptions

    @num_preemptions.setter
    def num_preemptions(self, value):
        self._num_preemptions = _check_count("num_preemptions", value)

    @property
    def shared_prefix_boundary(self):
        return self._shared_prefix_boundary

    @shared_prefix_boundary.setter
    def shared_prefix_boundary(self, value):
        self._shared_prefix_boundary = _check_count("shared_prefix_boundary", value)

    @property
    def skip_reading_prefix_cache(self):
        return self._skip_reading_prefix_cache

    @skip_reading_prefix_cache.setter
    def skip_reading_prefix_cache(self, value):
        self._skip_reading_prefix_cache = check_skip_reading_prefix_cache(value)

    @property
    def spec_token_ids(self):
        return self._spec_token_ids

    @spec_token_ids.setter
    def spec_token_ids(self, value):
        self._spec_token_ids = validate_token_ids(value, "spec_token_ids")

    @property
    def block_hashes(self):
        """The request's block hashes, one per full block (bytes)."""
        return self._block_hashes

    @block_hashes.setter
    def block_hashes(self, value):
        self._block_hashes = _checked_block_hashes(value)

    # ------------------------------------------------------------------ tokens
    @property
    def num_tokens(self):
        """Prompt plus output tokens."""
        return PyList_GET_SIZE(self._all_token_ids)

    @property
    def num_output_tokens(self):
        return PyList_GET_SIZE(self._output_token_ids)

    @property
    def output_token_ids(self):
        """The output tokens so far (do not mutate; use append_output_token_ids)."""
        return self._output_token_ids

    @property
    def all_token_ids(self):
        """Prompt followed by output tokens (do not mutate)."""
        return self._all_token_ids

    @property
    def is_finished(self):
        return RequestStatus.is_finished(self.status)

    def append_output_token_ids(self, token_ids):
        """Append sampled tokens and hash any blocks they complete.

        Raises:
            TypeError / ValueError: a token is not an int or does not fit in 64
                bits; nothing is appended then.
        """
        cdef list tokens
        if type(token_ids) is int and _fits_int64(token_ids):
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
        else:
            if isinstance(token_ids, int) and not isinstance(token_ids, bool):
                tokens = validate_token_ids([token_ids], "output token ids")
            else:
                tokens = validate_token_ids(token_ids, "output token ids")
            self._output_token_ids.extend(tokens)
            self._all_token_ids.extend(tokens)
        cdef Py_ssize_t bs = self._hash_block_size
        if self._block_hasher is not None:
            if bs <= 0 or (PyList_GET_SIZE(self._all_token_ids)
                           - PyList_GET_SIZE(self._block_hashes) * bs) >= bs:
                self._block_hashes.extend(self._block_hasher(self))

    def __repr__(self):
        return (
            f"Request(id={self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={_status_text(self.status)})"
        )


cdef str _status_text(object status):
    # An enum member (kvcy's or vLLM's RequestStatus) by name; anything else
    # callers stored (a plain int, say) by its repr.
    return status.name if isinstance(status, enum.Enum) else repr(status)


cdef list _checked_block_hashes(object value):
    # Block hashes as assigned from outside: a list of bytes.
    if type(value) is not list:
        raise TypeError(f"block_hashes must be a list of bytes, got {type(value).__name__}")
    for h in <list>value:
        if type(h) is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")
    return <list>value


cdef inline bint _fits_int64(object value) noexcept:
    cdef int overflow = 0
    PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0


# Fast field reads: a compiled Request's C fields, anything else by attribute.
cdef inline str _rid(object request):
    if type(request) is Request:
        return (<Request>request).request_id
    return _rid_of_other(request)


cdef str _rid_of_other(object request):
    cdef object request_id
    try:
        request_id = request.request_id
    except AttributeError:
        raise TypeError(f"expected a Request, got {type(request).__name__}") from None
    _check_rid(request_id)
    return request_id


cdef inline int _check_rid(object request_id) except -1:
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    return 0


cdef inline Py_ssize_t _num_tokens(object request) except -1:
    if type(request) is Request:
        return PyList_GET_SIZE((<Request>request)._all_token_ids)
    return request.num_tokens


cdef inline object _block_hashes_of(object request):
    if type(request) is Request:
        return (<Request>request)._block_hashes
    return request.block_hashes


cdef inline Py_ssize_t _hashed(object request, Py_ssize_t num_tokens, Py_ssize_t hash_block_size) except? -1:
    # Of the first num_tokens tokens, those the request has block hashes for.
    cdef Py_ssize_t n = len(_block_hashes_of(request)) * hash_block_size
    return num_tokens if num_tokens < n else n
