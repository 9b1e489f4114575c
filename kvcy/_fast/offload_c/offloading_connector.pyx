# offload_c/offloading_connector.pyx: ConnectorRequest and ReplayConnector, the replay's offloading connector
# (see offload_py/offloading_connector.py, the pure-Python twin, for what it does).
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.
#
# What is compiled: the key making (one bytes object and one position a key,
# no intermediate lists), the scan of the step's scheduled requests for
# offers (two attribute reads a request, and only for a request with prompt
# blocks left to offer), the offers' bookkeeping and the decision list
# (ints appended in C).  The manager is called through its Python methods,
# as any OffloadingManager, bound once.

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

from xxhash import xxh3_64_intdigest as _xxh3_64_intdigest

# The decision codes (kvcy.sim.scheduler's, which decodes them).
cdef enum:
    _CPU_LOOKUP = 11
    _CPU_LOAD = 12
    _CPU_STORE = 13
    _CPU_STORE_REFUSED = 14
    _CPU_FINISH = 15

cdef object _conn_ReqContext = ReqContext
cdef Py_ssize_t _CONN_MAX = ((<Py_ssize_t>1) << 62) - 1


cdef Py_ssize_t _conn_count(str name, object value) except -1:
    """A count from 0 to 2**62 - 1 as a C integer (the same messages as the pure twin's _check_count)."""
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= _CONN_MAX:
        raise ValueError(f"{name} must be from 0 to 2**62 - 1, got {value}")
    return <Py_ssize_t>value


cdef inline int _conn_check_dec(object dec) except -1:
    if type(dec) is not list:
        raise TypeError(f"dec must be a list, got {type(dec).__name__}")
    return 0


cdef inline int _conn_check_request(object st) except -1:
    if type(st) is not ConnectorRequest:
        raise TypeError(f"st must be a ConnectorRequest, got {type(st).__name__}")
    return 0


cdef int64_t _keys_code(object keys) except? -1:
    """A signed 64-bit stand-in for a list of keys in the decision list (a hash of them, in order)."""
    if not keys:
        return 0
    # (XXH3: the code only has to tell decision lists apart, and a
    # cryptographic digest of every evicted key cost ~6 % of the offloading)
    return <int64_t>(<uint64_t>_xxh3_64_intdigest(b"".join(keys)))


cdef class ConnectorRequest:
    """What the connector keeps for one request (it outlives the scheduler's ``Request``).

    Made by :meth:`ReplayConnector.new_request`; its fields are the
    connector's and read-only.
    """

    def __cinit__(self):
        self._keys = []     # (one made by __new__ alone has no keys, never None)

    def __init__(self, *args, **kwargs):
        raise TypeError("a ConnectorRequest is made by ReplayConnector.new_request")

    @property
    def req_context(self):
        """The request's ``ReqContext`` (its key positions, the manager's record)."""
        return self._ctx

    @property
    def index(self):
        """The request's index in the decision list."""
        return self._index

    @property
    def prompt_blocks(self):
        """Full blocks of the prompt: the blocks the request offers."""
        return self._prompt_blocks

    @property
    def num_keys(self):
        """Offload keys made so far."""
        return len(self._keys)

    @property
    def next_stored(self):
        """The first prompt block not offered (successfully) yet."""
        return self._next_stored


cdef class ReplayConnector:
    """The replay's connector between its scheduler loop and a ``CPUOffloadingManager``.

    Args:
        manager: the CPU tier (an ``OffloadingManager``).
        block_size: tokens per block (and per chunk).
        group_idx: the KV-cache group of the keys (their 4-byte suffix).

    Raises:
        TypeError: ``block_size`` or ``group_idx`` is not an int.
        ValueError: ``block_size`` < 1 or ``group_idx`` outside ``[0, 2**32)``.
    """

    def __cinit__(self):
        # made by __new__ alone (no __init__, no manager), a connector must
        # still be safe to call: its C code divides by _block_size and reads
        # _suffix's bytes without a check
        self._block_size = 1
        self._suffix = bytes(4)
        self._ends = []
        self._load_reqs = []
        self._load_keys = []
        self._store_reqs = []
        self._store_keys = []
        self._finishing = []
        self._finished = []

    def __init__(self, manager, block_size, group_idx=0):
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
        if not 1 <= block_size <= _CONN_MAX:
            raise ValueError(f"block_size must be from 1 to 2**62 - 1, got {block_size}")
        cdef Py_ssize_t bs = <Py_ssize_t>block_size
        if isinstance(group_idx, bool) or not isinstance(group_idx, int):
            raise TypeError(f"group_idx must be an int, got {type(group_idx).__name__}")
        if not 0 <= group_idx < (1 << 32):
            raise ValueError(f"group_idx must be in [0, 2**32), got {group_idx}")
        self._manager = manager
        self._block_size = bs
        self._suffix = int(group_idx).to_bytes(4, "big")
        self._count_hits = manager.count_hits
        self._prepare_load = manager.prepare_load
        self._prepare_store = manager.prepare_store
        self._complete_store = manager.complete_store
        self._complete_load = manager.complete_load
        self._on_request_finished = manager.on_request_finished
        self._ends = []
        self._load_reqs = []
        self._load_keys = []
        self._store_reqs = []
        self._store_keys = []
        self._finishing = []
        self._finished = []
        self._hit_blocks = 0
        self._blocks_loaded = 0
        self._blocks_stored = 0
        self._evictions = 0
        self._stores_refused = 0

    @property
    def manager(self):
        """The CPU tier the connector drives."""
        return self._manager

    @property
    def block_size(self):
        """Tokens per block."""
        return self._block_size

    @property
    def hit_blocks(self):
        """Blocks loaded from the CPU tier at admissions (counted when the load is prepared)."""
        return self._hit_blocks

    @property
    def blocks_loaded(self):
        """Blocks whose load completed."""
        return self._blocks_loaded

    @property
    def blocks_stored(self):
        """Blocks the manager took for storing."""
        return self._blocks_stored

    @property
    def evictions(self):
        """Keys the CPU tier evicted for stores."""
        return self._evictions

    @property
    def stores_refused(self):
        """Offers ``prepare_store`` refused (``None``)."""
        return self._stores_refused

    @property
    def has_pending(self):
        """Finished requests whose end (``on_request_finished``) is still to come."""
        return bool(self._finished or self._finishing)

    def new_request(self, request_id, num_prompt_tokens, index):
        """A new request's state: its ``ReqContext``, announced to the manager (``on_new_request``).

        Raises:
            TypeError: ``request_id`` is not a str, or a count not an int.
            ValueError: a negative count.
        """
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        cdef Py_ssize_t num_prompt = _conn_count("num_prompt_tokens", num_prompt_tokens)
        cdef Py_ssize_t idx = _conn_count("index", index)
        ctx = _conn_ReqContext(req_id=request_id)
        self._manager.on_new_request(ctx)
        cdef ConnectorRequest st = ConnectorRequest.__new__(ConnectorRequest)
        st._ctx = ctx
        st._index = idx
        st._prompt_blocks = num_prompt // self._block_size
        st._keys = []
        st._next_stored = 0
        st._req = None
        st._hit_first = 0
        st._hits = 0
        return st

    cdef int _make_keys(self, ConnectorRequest st, list block_hashes, Py_ssize_t n) except -1:
        """Make the request's keys up to its ``n``-th (each with its end-token position)."""
        cdef list keys = st._keys
        cdef Py_ssize_t start = len(keys), i, hlen
        cdef Py_ssize_t bs = self._block_size
        cdef const char *suffix = PyBytes_AS_STRING(self._suffix)
        cdef list hashes, ends, new
        cdef bytes key
        cdef char *out
        if n > len(block_hashes):
            n = len(block_hashes)
        if start >= n:
            return 0
        # a copy of the hashes used (nothing can change it while the keys are
        # made), each checked before any key is kept
        hashes = block_hashes[start:n]
        for h in hashes:
            if type(h) is not bytes:
                raise TypeError(f"a block hash must be bytes, got {type(h).__name__}")
        ctx = st._ctx
        positions = ctx._offload_key_positions
        if start == 0 and type(positions) is dict and not positions and n > 8:
            # a request's first keys: one table of the right size instead of
            # growing it key by key (nothing else holds the empty one yet)
            positions = _PyDict_NewPresized(n)
            ctx._offload_key_positions = positions
        # the end-token positions, as ints shared by every request
        ends = self._ends
        while len(ends) < n:
            ends.append((len(ends) + 1) * bs)
        new = []
        for i in range(n - start):
            h = hashes[i]
            hlen = PyBytes_GET_SIZE(h)
            key = PyBytes_FromStringAndSize(NULL, hlen + 4)
            out = PyBytes_AS_STRING(key)
            memcpy(out, PyBytes_AS_STRING(h), hlen)
            memcpy(out + hlen, suffix, 4)
            new.append(key)
        # what set_offload_key_position records, for the keys just made
        if type(positions) is dict:
            for i in range(n - start):
                (<dict>positions)[new[i]] = ends[start + i]
        else:
            positions.update(zip(new, ends[start:n]))
        keys.extend(new)
        return 0

    def lookup(self, st, request, gpu_hit, dec):
        """The CPU-tier hit, in tokens, after a GPU hit of ``gpu_hit`` (vLLM's ``get_num_new_matched_tokens``).

        The blocks after the GPU hit are looked up until the first one that is
        not a ``HIT``, never the block of the request's last token.  The hit is
        loaded only if :meth:`allocated` follows (before the next lookup).
        The request's keys are made here: every prompt key (for the offers)
        and at least up to the last block looked at.

        Raises:
            TypeError: ``st`` is not a ConnectorRequest, ``dec`` not a list,
                ``gpu_hit`` not an int, or a block hash not bytes.
            ValueError: a negative ``gpu_hit``.
        """
        _conn_check_request(st)
        cdef Py_ssize_t hit = _conn_count("gpu_hit", gpu_hit)
        _conn_check_dec(dec)
        cdef ConnectorRequest r = <ConnectorRequest>st
        cdef Py_ssize_t bs = self._block_size
        cdef Py_ssize_t num_tokens = _conn_count("request.num_tokens", request.num_tokens)
        block_hashes = request.block_hashes
        if type(block_hashes) is not list:
            block_hashes = list(block_hashes)
        cdef Py_ssize_t first = hit // bs
        cdef Py_ssize_t last = (num_tokens - 1) // bs if num_tokens else 0   # never the block of the last token
        cdef Py_ssize_t want = last if last > r._prompt_blocks else r._prompt_blocks
        cdef Py_ssize_t hits = 0
        if want > len(r._keys):
            self._make_keys(r, <list>block_hashes, want)
        r._req = request
        if last > first:
            hits = self._count_hits(r._keys, r._ctx, first, last)
        r._hit_first = first
        r._hits = hits
        cdef list d = <list>dec
        d.append(_CPU_LOOKUP)
        d.append(r._index)
        d.append(hits)
        return hits * bs

    def allocated(self, st, computed_tokens, dec):
        """The request was admitted with ``computed_tokens`` computed (vLLM's ``update_state_after_alloc``).

        With a CPU-tier hit from the last :meth:`lookup` the hit is loaded
        (``prepare_load``; it completes at :meth:`step_end`) and the offers
        continue after ``computed_tokens``; without one, the offers start at
        the first block again.

        Raises:
            TypeError: ``st`` is not a ConnectorRequest, ``dec`` not a list or
                ``computed_tokens`` not an int.
            ValueError: a negative ``computed_tokens``.
        """
        _conn_check_request(st)
        cdef Py_ssize_t computed = _conn_count("computed_tokens", computed_tokens)
        _conn_check_dec(dec)
        cdef ConnectorRequest r = <ConnectorRequest>st
        cdef Py_ssize_t hits = r._hits
        cdef list d = <list>dec
        if not hits:
            r._next_stored = 0
            return
        r._hits = 0
        cdef Py_ssize_t first = r._hit_first
        keys = r._keys[first:first + hits]
        ids = self._prepare_load(keys, r._ctx).block_ids.tolist()
        d.append(_CPU_LOAD)
        d.append(r._index)
        d.append(len(ids))
        d.extend(ids)
        self._load_reqs.append(r)
        self._load_keys.append(keys)
        self._hit_blocks += hits
        r._next_stored = computed // self._block_size

    cdef int _offer(self, ConnectorRequest st, Py_ssize_t end, list dec) except -1:
        """Offer the prompt blocks before block ``end`` that were not offered yet."""
        cdef Py_ssize_t start = st._next_stored
        if end > st._prompt_blocks:
            end = st._prompt_blocks
        if end <= start:
            return 0
        out = self._prepare_store(st._keys[start:end], st._ctx)
        if out is None:
            self._stores_refused += 1
            dec.append(_CPU_STORE_REFUSED)
            dec.append(st._index)
            dec.append(end - start)
            return 0
        st._next_stored = end
        stored = out.keys_to_store
        ids = out.store_spec.block_ids.tolist()
        evicted = out.evicted_keys
        dec.append(_CPU_STORE)
        dec.append(st._index)
        dec.append(len(ids))
        dec.extend(ids)
        dec.append(len(evicted))
        dec.append(_keys_code(evicted))
        if stored:
            self._store_reqs.append(st)
            self._store_keys.append(stored)
            self._blocks_stored += len(stored)
        self._evictions += len(evicted)
        return 0

    def build_connector_meta(self, scheduled, dec):
        """This step's store offers, then the ends of the requests that finished in the previous step.

        Args:
            scheduled: the step's scheduled requests, in order, as ``(entry,
                num_new_tokens)`` pairs, ``entry.off`` being the request's
                ConnectorRequest (the replay's scheduled list).  A request
                offers the prompt blocks complete once its ``num_new_tokens``
                are computed (after its Request's ``num_computed_tokens``).
            dec: the step's decision list.

        Raises:
            TypeError: ``scheduled`` or ``dec`` is not a list, an item is not
                a pair or its ``off`` not a ConnectorRequest, or a count not
                an int.
            ValueError: a negative count, or a scheduled request that was
                never looked up.
        """
        if type(scheduled) is not list:
            raise TypeError(f"scheduled must be a list, got {type(scheduled).__name__}")
        _conn_check_dec(dec)
        cdef list items = <list>scheduled
        cdef Py_ssize_t bs = self._block_size, i, n, computed
        cdef ConnectorRequest st
        cdef list offers = None
        cdef vector[Py_ssize_t] ends
        # every item checked before anything is offered
        for item in items:     # (an entry's `off` may run Python code: the list is re-checked each item)
            if type(item) is not tuple:
                raise TypeError(f"a scheduled item must be an (entry, num_new_tokens) pair, got {type(item).__name__}")
            if PyTuple_GET_SIZE(item) != 2:
                raise TypeError(
                    f"a scheduled item must be an (entry, num_new_tokens) pair, got {PyTuple_GET_SIZE(item)} items"
                )
            off = (<object>PyTuple_GET_ITEM(item, 0)).off
            if type(off) is not ConnectorRequest:
                raise TypeError(f"a scheduled entry's off must be a ConnectorRequest, got {type(off).__name__}")
            st = <ConnectorRequest>off
            if st._next_stored >= st._prompt_blocks:
                continue    # every prompt block offered: nothing to offer
            n = _conn_count("num_new_tokens", <object>PyTuple_GET_ITEM(item, 1))
            if st._req is None:
                raise ValueError("a scheduled request was never looked up (ReplayConnector.lookup)")
            computed = _conn_count("num_computed_tokens", st._req.num_computed_tokens)
            if offers is None:
                offers = []
            offers.append(st)
            ends.push_back((computed + n) // bs)
        if offers is not None:
            for i in range(len(offers)):
                self._offer(<ConnectorRequest>offers[i], ends[i], <list>dec)
        self._end_previous(<list>dec)

    def finished(self, st):
        """The request finished this step; it ends (final offer, ``on_request_finished``) next step.

        Raises:
            TypeError: ``st`` is not a ConnectorRequest.
        """
        _conn_check_request(st)
        (<ConnectorRequest>st)._req = None   # (its final offer covers every prompt block: no token count needed)
        self._finishing.append(st)

    cdef int _end_previous(self, list dec) except -1:
        cdef ConnectorRequest st
        if not self._finished:
            return 0
        for obj in self._finished:
            st = <ConnectorRequest>obj
            self._offer(st, st._prompt_blocks, dec)
            self._on_request_finished(st._ctx)
            dec.append(_CPU_FINISH)
            dec.append(st._index)
        self._finished = []
        return 0

    def end_previous(self, dec):
        """The final offers and ``on_request_finished`` of the requests that finished in the previous step.

        Raises:
            TypeError: ``dec`` is not a list.
        """
        _conn_check_dec(dec)
        self._end_previous(<list>dec)

    def step_end(self):
        """The worker's reports: this step's stores and loads are done; this step's finished requests end next step."""
        cdef Py_ssize_t i
        cdef list reqs, keys
        if self._store_reqs:
            reqs, keys = self._store_reqs, self._store_keys
            self._store_reqs, self._store_keys = [], []
            for i in range(len(reqs)):
                self._complete_store(keys[i], (<ConnectorRequest>reqs[i])._ctx)
        if self._load_reqs:
            reqs, keys = self._load_reqs, self._load_keys
            self._load_reqs, self._load_keys = [], []
            for i in range(len(reqs)):
                self._complete_load(keys[i], (<ConnectorRequest>reqs[i])._ctx)
                self._blocks_loaded += len(<list>keys[i])
        self._finished, self._finishing = self._finishing, []
