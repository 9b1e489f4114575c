"""The replay's CPU tier: a ``CPUOffloadingManager`` driven the way vLLM's offloading connector drives it.

vLLM 0.33.0's ``OffloadingConnectorScheduler`` sits between the scheduler and
the offloading manager.  :class:`CPUTier` plays that part inside the replay's
synchronous loop, with one offloaded block (a *chunk*) per GPU block and one
KV-cache group, so an offload key is a block hash plus group index 0
(:func:`~kvcy.kv_offload.make_offload_key`):

* **Admission** (``get_num_new_matched_tokens``): after the GPU prefix hit, the
  blocks that follow are looked up in the CPU tier one key at a time until the
  first one that is not a ``HIT``; never the block holding the prompt's last
  token, which is always computed (vLLM loads that block too and then
  recomputes only the last token; here at most one block of such a hit is
  computed instead of loaded).  When the allocation succeeds the hit is loaded
  (``prepare_load``; ``update_state_after_alloc``) and the loaded tokens count
  as computed at once: the load completes (``complete_load``) at the end of
  the step, as a worker would report it.
* **Stores** (``build_connector_meta``): every step, each scheduled request
  offers the prompt blocks that this step's tokens complete, from the first
  block it has not offered yet (``prepare_store``, prompt blocks only: vLLM's
  ``offload_prompt_only``); a ``None`` offers them again next step.  Requests
  that finished in the previous step then make their final offer and end
  (``on_request_finished``).  Stores complete (``complete_store``) at the end
  of the step.
* Each request has a ``ReqContext`` (created, with ``on_new_request``, when the
  scheduler first looks at it) holding every key's end-token position, as the
  connector sets them, so that LRU ranks a request's blocks head to tail.

Every decision (hits, chunk ids loaded, keys stored with their chunks, keys
evicted, refused stores, finished requests) is appended to the step's
decision list, so the replay's digest covers offloading too.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvcy.sim.scheduler import CPU_FINISH, CPU_LOAD, CPU_LOOKUP, CPU_STORE, CPU_STORE_REFUSED

__all__ = ["CPUTier", "cpu_blocks_from_spec", "offload_twin"]


def offload_twin(impl: str) -> tuple[str, Any]:
    """``(implementation, module)`` of the offloading twin that goes with the KV-cache manager's ``impl``.

    The compiled offloading twin is used with the compiled manager when it is
    built; otherwise the pure-Python one (and the implementation says so).
    """
    from kvcy.kv_offload import _twin

    if impl == "cython":
        try:
            return "cython", _twin.load("cython")
        except ImportError:
            pass
    return "python", _twin.load("python")


def _keys_code(keys: list[bytes]) -> int:
    """A signed 64-bit stand-in for a list of keys in the decision list (a hash of them, in order)."""
    if not keys:
        return 0
    return int.from_bytes(hashlib.blake2b(b"".join(keys), digest_size=8).digest(), "little", signed=True)


class _ReqState:
    """What the tier keeps for one request (it outlives the scheduler's ``Request``)."""

    __slots__ = ("ctx", "positions", "keys", "next_stored", "prompt_blocks", "index")

    def __init__(self, ctx: Any, prompt_blocks: int, index: int) -> None:
        self.ctx = ctx
        self.positions: dict[bytes, int] = ctx._offload_key_positions
        self.keys: list[bytes] = []
        self.next_stored = 0
        self.prompt_blocks = prompt_blocks
        self.index = index


class CPUTier:
    """One replay's CPU tier and the connector-side state around it.

    Args:
        impl: the KV-cache manager's implementation (picks the offloading twin).
        num_blocks: the tier's size in blocks (chunks).
        policy: ``"lru"`` or ``"arc"``.
        block_size: tokens per block.
    """

    def __init__(self, impl: str, num_blocks: int, policy: str, block_size: int) -> None:
        from kvcy.kv_offload import ReqContext, make_offload_key

        self.impl, twin = offload_twin(impl)
        self.manager = twin.CPUOffloadingManager(num_chunks=num_blocks, cache_policy=policy)
        self._req_context = ReqContext
        self._suffix = make_offload_key(b"", 0)  # group 0's 4-byte suffix
        # lookup until the first key that is not a HIT, in one call
        self._count_hits = self.manager.count_hits
        self.block_size = block_size
        # this step's jobs, completed at its end: (state, keys) per request
        self._loads: list[tuple[_ReqState, list[bytes]]] = []
        self._stores: list[tuple[_ReqState, list[bytes]]] = []
        # requests that finished this step: final offer and on_request_finished next step
        self._finished: list[_ReqState] = []
        self._finishing: list[_ReqState] = []
        # what the report needs
        self.hit_blocks = 0
        self.blocks_loaded = 0
        self.blocks_stored = 0
        self.evictions = 0
        self.stores_refused = 0

    def state(self, request_id: str, num_prompt_tokens: int, index: int) -> _ReqState:
        """A new request's state: its context, announced to the manager (``on_new_request``)."""
        ctx = self._req_context(req_id=request_id)
        self.manager.on_new_request(ctx)
        return _ReqState(ctx, num_prompt_tokens // self.block_size, index)

    def _keys_to(self, st: _ReqState, block_hashes: list[bytes], n: int) -> list[bytes]:
        """The request's first ``n`` keys, making (and positioning) the missing ones."""
        keys = st.keys
        start = len(keys)
        if start < n:
            # make_offload_key(h, 0) is h + the group suffix: one concatenation a key.
            suffix = self._suffix
            new = [h + suffix for h in block_hashes[start:n]]
            bs = self.block_size
            # What set_offload_key_position stores, for keys made just above
            # (it would re-check each of them; a long prompt has thousands).
            st.positions.update(zip(new, range((start + 1) * bs, (n + 1) * bs, bs)))
            keys += new
        return keys

    def lookup(self, st: _ReqState, req: Any, gpu_hit: int, dec: list[int]) -> tuple[int, list[bytes]]:
        """Tokens of the CPU hit after ``gpu_hit`` and the keys to load (not loaded yet)."""
        bs = self.block_size
        first = gpu_hit // bs
        last = (req.num_tokens - 1) // bs  # never the block of the last token
        hits: list[bytes] = []
        if st.prompt_blocks > len(st.keys) or last > len(st.keys):
            self._keys_to(st, req.block_hashes, max(last, st.prompt_blocks))  # every prompt key, for the offers
        if last > first:
            keys = st.keys
            n = self._count_hits(keys, st.ctx, first, last)
            if n:
                hits = keys[first : first + n]
        dec += (CPU_LOOKUP, st.index, len(hits))
        return len(hits) * bs, hits

    def load(self, st: _ReqState, keys: list[bytes], computed_tokens: int, dec: list[int]) -> None:
        """The request was admitted with ``keys`` from the CPU tier: load them (complete at step end)."""
        spec = self.manager.prepare_load(keys, st.ctx)
        ids = spec.block_ids.tolist()
        dec += (CPU_LOAD, st.index, len(ids))
        dec += ids
        self._loads.append((st, keys))
        self.hit_blocks += len(keys)
        st.next_stored = computed_tokens // self.block_size

    def admitted(self, st: _ReqState) -> None:
        """A (re-)admission without a CPU hit: its offers start at its first block again."""
        st.next_stored = 0

    def offer(self, st: _ReqState, computed_tokens: int, dec: list[int]) -> None:
        """Offer the prompt blocks complete at ``computed_tokens`` that were not offered yet."""
        end = computed_tokens // self.block_size
        if end > st.prompt_blocks:
            end = st.prompt_blocks
        start = st.next_stored
        if end <= start:
            return
        offer = st.keys[start:end]  # prompt keys are all made at the first lookup
        out = self.manager.prepare_store(offer, st.ctx)
        if out is None:
            self.stores_refused += 1
            dec += (CPU_STORE_REFUSED, st.index, end - start)
            return
        st.next_stored = end
        stored = out.keys_to_store
        ids = out.store_spec.block_ids.tolist()
        evicted = out.evicted_keys
        dec += (CPU_STORE, st.index, len(ids))
        dec += ids
        dec += (len(evicted), _keys_code(evicted))
        if stored:
            self._stores.append((st, stored))
            self.blocks_stored += len(stored)
        self.evictions += len(evicted)

    def finished(self, st: _ReqState) -> None:
        """The request finished this step; it ends (final offer, ``on_request_finished``) next step."""
        self._finishing.append(st)

    def end_previous(self, dec: list[int]) -> None:
        """The final offers and ``on_request_finished`` of requests that finished in the previous step."""
        if self._finished:
            on_request_finished = self.manager.on_request_finished
            for st in self._finished:
                self.offer(st, st.prompt_blocks * self.block_size, dec)
                on_request_finished(st.ctx)
                dec += (CPU_FINISH, st.index)
            self._finished = []

    def step_end(self) -> None:
        """The worker's reports: this step's stores and loads are done."""
        if self._stores:
            complete_store = self.manager.complete_store
            for st, keys in self._stores:
                complete_store(keys, st.ctx)
            self._stores = []
        if self._loads:
            complete_load = self.manager.complete_load
            for st, keys in self._loads:
                complete_load(keys, st.ctx)
                self.blocks_loaded += len(keys)
            self._loads = []
        self._finished, self._finishing = self._finishing, []

    @property
    def has_pending(self) -> bool:
        """Finished requests whose end (``on_request_finished``) is still to come."""
        return bool(self._finished or self._finishing)


def cpu_blocks_from_spec(text: str, gpu_blocks: int, bytes_per_block: int) -> int:
    """Blocks of a ``--cpu-offload`` value: ``8x`` (times ``gpu_blocks``, the GPU pool's usable blocks) or a size (``64GiB``).

    Raises:
        ValueError: not a multiple or a size, or less than one block.
    """
    from kvcy.cli import parse_size

    spec = text.strip()
    if spec[-1:] in ("x", "X"):
        try:
            factor = float(spec[:-1])
        except ValueError:
            factor = float("nan")
        if not 0 < factor <= 1024:
            raise ValueError(f"--cpu-offload {text!r}: a multiple of the GPU pool must be > 0 and <= 1024")
        return max(1, int(round(gpu_blocks * factor)))
    n = parse_size(spec) // bytes_per_block
    if n < 1:
        raise ValueError(f"--cpu-offload {text!r} holds no block of {bytes_per_block:,} bytes")
    return n
