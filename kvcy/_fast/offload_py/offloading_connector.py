"""The replay's offloading connector: a ``CPUOffloadingManager`` driven as vLLM 0.33.0's connector drives it.

vLLM's ``OffloadingConnectorScheduler`` sits between the scheduler and the
offloading manager.  :class:`ReplayConnector` plays that part inside
``kvcy replay``'s synchronous loop (:mod:`kvcy.sim.offload` builds it), with
one offloaded chunk per GPU block and one KV-cache group:

* **keys**: a request's offload keys are its block hashes plus the group
  index (``make_offload_key``), made once, each with its end-token position
  on the request's ``ReqContext`` (``set_offload_key_position``);
* **admission** (:meth:`~ReplayConnector.lookup`, vLLM's
  ``get_num_new_matched_tokens``): the blocks after the GPU prefix hit are
  looked up until the first one that is not a ``HIT`` (``count_hits``), never
  the block of the prompt's last token; once the allocation succeeds
  (:meth:`~ReplayConnector.allocated`, ``update_state_after_alloc``) the hit is
  loaded (``prepare_load``);
* **stores** (:meth:`~ReplayConnector.build_connector_meta`): each scheduled
  request offers the prompt blocks this step completes, from the first one it
  has not offered yet (``prepare_store``; a ``None`` offers them again next
  step); then the requests that finished in the previous step make their
  final offer and end (``on_request_finished``);
* **the worker's reports** (:meth:`~ReplayConnector.step_end`): the step's
  stores and loads complete (``complete_store``, ``complete_load``).

Every decision is appended, as ints, to the step's decision list ``dec`` (the
replay's digest covers it): ``CPU_LOOKUP, index, hits``; ``CPU_LOAD, index, n,
chunk ids...``; ``CPU_STORE, index, n, chunk ids..., evicted, evicted-keys
code``; ``CPU_STORE_REFUSED, index, offered``; ``CPU_FINISH, index``.

This module is the pure-Python twin; ``offload_c/offloading_connector.pyx`` the compiled
one (same names, decisions and messages).
"""

from __future__ import annotations

from typing import Any

from xxhash import xxh3_64_intdigest

from kvcy.kv_offload.base import ReqContext

__all__ = ["ConnectorRequest", "ReplayConnector"]

# The decision codes (kvcy.sim.scheduler's, which decodes them).
CPU_LOOKUP, CPU_LOAD, CPU_STORE, CPU_STORE_REFUSED, CPU_FINISH = 11, 12, 13, 14, 15


def _keys_code(keys: list[bytes]) -> int:
    """A signed 64-bit stand-in for a list of keys in the decision list (a hash of them, in order)."""
    if not keys:
        return 0
    # (XXH3: the code only has to tell decision lists apart, and a
    # cryptographic digest of every evicted key cost ~6 % of the offloading)
    code = xxh3_64_intdigest(b"".join(keys))
    return code - (1 << 64) if code >= 1 << 63 else code


def _check_dec(dec: Any) -> None:
    if type(dec) is not list:
        raise TypeError(f"dec must be a list, got {type(dec).__name__}")


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < 1 << 62:
        raise ValueError(f"{name} must be from 0 to 2**62 - 1, got {value}")
    return value


class ConnectorRequest:
    """What the connector keeps for one request (it outlives the scheduler's ``Request``).

    Made by :meth:`ReplayConnector.new_request`; its fields are the
    connector's and read-only.
    """

    __slots__ = ("_ctx", "_index", "_prompt_blocks", "_keys", "_next_stored", "_req", "_hit_first", "_hits")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a ConnectorRequest is made by ReplayConnector.new_request")

    @property
    def req_context(self) -> ReqContext:
        """The request's ``ReqContext`` (its key positions, the manager's record)."""
        return self._ctx

    @property
    def index(self) -> int:
        """The request's index in the decision list."""
        return self._index

    @property
    def prompt_blocks(self) -> int:
        """Full blocks of the prompt: the blocks the request offers."""
        return self._prompt_blocks

    @property
    def num_keys(self) -> int:
        """Offload keys made so far."""
        return len(self._keys)

    @property
    def next_stored(self) -> int:
        """The first prompt block not offered (successfully) yet."""
        return self._next_stored


class ReplayConnector:
    """The replay's connector between its scheduler loop and a ``CPUOffloadingManager``.

    Args:
        manager: the CPU tier (an ``OffloadingManager``).
        block_size: tokens per block (and per chunk).
        group_idx: the KV-cache group of the keys (their 4-byte suffix).

    Raises:
        TypeError: ``block_size`` or ``group_idx`` is not an int.
        ValueError: ``block_size`` < 1 or ``group_idx`` outside ``[0, 2**32)``.
    """

    __slots__ = ("_manager", "_block_size", "_suffix", "_loads", "_stores", "_finishing", "_finished",
                 "_hit_blocks", "_blocks_loaded", "_blocks_stored", "_evictions", "_stores_refused")

    def __init__(self, manager: Any, block_size: int, group_idx: int = 0) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
        if not 1 <= block_size < 1 << 62:
            raise ValueError(f"block_size must be from 1 to 2**62 - 1, got {block_size}")
        if isinstance(group_idx, bool) or not isinstance(group_idx, int):
            raise TypeError(f"group_idx must be an int, got {type(group_idx).__name__}")
        if not 0 <= group_idx < 1 << 32:
            raise ValueError(f"group_idx must be in [0, 2**32), got {group_idx}")
        self._manager = manager
        self._block_size = block_size
        self._suffix = group_idx.to_bytes(4, "big")
        # this step's jobs, completed at its end: (request, keys)
        self._loads: list[tuple[ConnectorRequest, list[bytes]]] = []
        self._stores: list[tuple[ConnectorRequest, list[bytes]]] = []
        # requests that finished this step (they end next step) and in the previous one
        self._finishing: list[ConnectorRequest] = []
        self._finished: list[ConnectorRequest] = []
        self._hit_blocks = 0
        self._blocks_loaded = 0
        self._blocks_stored = 0
        self._evictions = 0
        self._stores_refused = 0

    @property
    def manager(self) -> Any:
        """The CPU tier the connector drives."""
        return self._manager

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def hit_blocks(self) -> int:
        """Blocks loaded from the CPU tier at admissions (counted when the load is prepared)."""
        return self._hit_blocks

    @property
    def blocks_loaded(self) -> int:
        """Blocks whose load completed."""
        return self._blocks_loaded

    @property
    def blocks_stored(self) -> int:
        """Blocks the manager took for storing."""
        return self._blocks_stored

    @property
    def evictions(self) -> int:
        """Keys the CPU tier evicted for stores."""
        return self._evictions

    @property
    def stores_refused(self) -> int:
        """Offers ``prepare_store`` refused (``None``)."""
        return self._stores_refused

    @property
    def has_pending(self) -> bool:
        """Finished requests whose end (``on_request_finished``) is still to come."""
        return bool(self._finished or self._finishing)

    def new_request(self, request_id: str, num_prompt_tokens: int, index: int) -> ConnectorRequest:
        """A new request's state: its ``ReqContext``, announced to the manager (``on_new_request``).

        Raises:
            TypeError: ``request_id`` is not a str, or a count not an int.
            ValueError: a negative count.
        """
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        _check_count("num_prompt_tokens", num_prompt_tokens)
        _check_count("index", index)
        ctx = ReqContext(req_id=request_id)
        self._manager.on_new_request(ctx)
        st = object.__new__(ConnectorRequest)
        st._ctx = ctx
        st._index = index
        st._prompt_blocks = num_prompt_tokens // self._block_size
        st._keys = []
        st._next_stored = 0
        st._req = None
        st._hit_first = 0
        st._hits = 0
        return st

    def _make_keys(self, st: ConnectorRequest, block_hashes: list[bytes], n: int) -> None:
        """Make the request's keys up to its ``n``-th (each with its end-token position)."""
        keys = st._keys
        start = len(keys)
        if n > len(block_hashes):
            n = len(block_hashes)
        if start >= n:
            return
        suffix = self._suffix
        new = []
        for h in block_hashes[start:n]:
            if type(h) is not bytes:
                raise TypeError(f"a block hash must be bytes, got {type(h).__name__}")
            new.append(h + suffix)
        bs = self._block_size
        # what set_offload_key_position records, for keys just made
        st._ctx._offload_key_positions.update(zip(new, range((start + 1) * bs, (n + 1) * bs, bs)))
        keys += new

    def lookup(self, st: ConnectorRequest, request: Any, gpu_hit: int, dec: list[int]) -> int:
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
        if type(st) is not ConnectorRequest:
            raise TypeError(f"st must be a ConnectorRequest, got {type(st).__name__}")
        _check_count("gpu_hit", gpu_hit)
        _check_dec(dec)
        bs = self._block_size
        num_tokens = _check_count("request.num_tokens", request.num_tokens)
        block_hashes = request.block_hashes
        if type(block_hashes) is not list:
            block_hashes = list(block_hashes)
        first = gpu_hit // bs
        last = (num_tokens - 1) // bs if num_tokens else 0  # never the block of the last token
        want = last if last > st._prompt_blocks else st._prompt_blocks
        if want > len(st._keys):
            self._make_keys(st, block_hashes, want)
        st._req = request
        hits = 0
        if last > first:
            hits = self._manager.count_hits(st._keys, st._ctx, first, last)
        st._hit_first = first
        st._hits = hits
        dec += (CPU_LOOKUP, st._index, hits)
        return hits * bs

    def allocated(self, st: ConnectorRequest, computed_tokens: int, dec: list[int]) -> None:
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
        if type(st) is not ConnectorRequest:
            raise TypeError(f"st must be a ConnectorRequest, got {type(st).__name__}")
        _check_count("computed_tokens", computed_tokens)
        _check_dec(dec)
        hits = st._hits
        if not hits:
            st._next_stored = 0
            return
        st._hits = 0
        first = st._hit_first
        keys = st._keys[first : first + hits]
        ids = self._manager.prepare_load(keys, st._ctx).block_ids.tolist()
        dec += (CPU_LOAD, st._index, len(ids))
        dec += ids
        self._loads.append((st, keys))
        self._hit_blocks += hits
        st._next_stored = computed_tokens // self._block_size

    def _offer(self, st: ConnectorRequest, end: int, dec: list[int]) -> None:
        """Offer the prompt blocks before block ``end`` that were not offered yet."""
        if end > st._prompt_blocks:
            end = st._prompt_blocks
        start = st._next_stored
        if end <= start:
            return
        out = self._manager.prepare_store(st._keys[start:end], st._ctx)
        if out is None:
            self._stores_refused += 1
            dec += (CPU_STORE_REFUSED, st._index, end - start)
            return
        st._next_stored = end
        stored = out.keys_to_store
        ids = out.store_spec.block_ids.tolist()
        evicted = out.evicted_keys
        dec += (CPU_STORE, st._index, len(ids))
        dec += ids
        dec += (len(evicted), _keys_code(evicted))
        if stored:
            self._stores.append((st, stored))
            self._blocks_stored += len(stored)
        self._evictions += len(evicted)

    def build_connector_meta(self, scheduled: list[tuple[Any, int]], dec: list[int]) -> None:
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
        _check_dec(dec)
        bs = self._block_size
        # every item checked before anything is offered
        offers = []
        for item in scheduled:
            if type(item) is not tuple:
                raise TypeError(f"a scheduled item must be an (entry, num_new_tokens) pair, got {type(item).__name__}")
            if len(item) != 2:
                raise TypeError(f"a scheduled item must be an (entry, num_new_tokens) pair, got {len(item)} items")
            st = item[0].off
            if type(st) is not ConnectorRequest:
                raise TypeError(f"a scheduled entry's off must be a ConnectorRequest, got {type(st).__name__}")
            if st._next_stored >= st._prompt_blocks:
                continue  # every prompt block offered: nothing to offer
            n = _check_count("num_new_tokens", item[1])
            if st._req is None:
                raise ValueError("a scheduled request was never looked up (ReplayConnector.lookup)")
            computed = _check_count("num_computed_tokens", st._req.num_computed_tokens)
            offers.append((st, (computed + n) // bs))
        for st, end in offers:
            self._offer(st, end, dec)
        self.end_previous(dec)

    def finished(self, st: ConnectorRequest) -> None:
        """The request finished this step; it ends (final offer, ``on_request_finished``) next step.

        Raises:
            TypeError: ``st`` is not a ConnectorRequest.
        """
        if type(st) is not ConnectorRequest:
            raise TypeError(f"st must be a ConnectorRequest, got {type(st).__name__}")
        st._req = None  # (its final offer covers every prompt block: no token count needed)
        self._finishing.append(st)

    def end_previous(self, dec: list[int]) -> None:
        """The final offers and ``on_request_finished`` of the requests that finished in the previous step.

        Raises:
            TypeError: ``dec`` is not a list.
        """
        _check_dec(dec)
        if not self._finished:
            return
        on_request_finished = self._manager.on_request_finished
        for st in self._finished:
            self._offer(st, st._prompt_blocks, dec)
            on_request_finished(st._ctx)
            dec += (CPU_FINISH, st._index)
        self._finished = []

    def step_end(self) -> None:
        """The worker's reports: this step's stores and loads are done; this step's finished requests end next step."""
        if self._stores:
            stores, self._stores = self._stores, []
            complete_store = self._manager.complete_store
            for st, keys in stores:
                complete_store(keys, st._ctx)
        if self._loads:
            loads, self._loads = self._loads, []
            complete_load = self._manager.complete_load
            for st, keys in loads:
                complete_load(keys, st._ctx)
                self._blocks_loaded += len(keys)
        self._finished, self._finishing = self._finishing, []
