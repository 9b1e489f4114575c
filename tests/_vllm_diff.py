"""A differential harness: vLLM 0.33.0's ``KVCacheManager`` and kvcy's, driven side by side.

One config description (:class:`Config`: KV-cache groups as spec class names and keyword
arguments, plus the manager's options) builds both managers: vLLM's from vLLM's specs, kvcy's
from the same config converted by ``kvcy.vllm.convert_kv_cache_config`` (what the drop-in does)
and the active twin's ``KVCacheManager``.  :class:`Pair` then applies the same scheduler-level
operations (:class:`Op`) to both, with requests built from the same token ids and the same
block hasher, and returns what each side returned and held after it, as plain data
(:func:`snapshot`): every call's result (block ids per group, None, or the exception's type),
every live request's block ids per group (all, and those covering its computed tokens), its
estimated cached tokens and remaining blocks (as the scheduler asks the coordinator), the
free-queue order, every keyed block (key, token count, reference count), the extra partial
keys, the cache map, the KV events taken, ``take_new_block_ids``, the copy-on-write copies,
the boundary-state offloads, ``usage`` and the prefix-cache stats.

Only importable where vLLM is (the live test modules import it after their skip check).
tests/vllm_live/test_vllm_state_machine.py drives it with hypothesis; it holds the table of configs.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Keyword arguments every attention spec of a config gets unless it sets its own.
ATTN = dict(num_kv_heads=1, head_size=8, dtype="float16")


@dataclasses.dataclass(frozen=True)
class Config:
    """One manager configuration, described once for both libraries.

    ``groups``: ``(spec class name, keyword arguments)`` per KV-cache group; attention specs
    get :data:`ATTN` for what they leave out, dtypes are torch names (``"float16"``).
    ``eagle_groups``: the groups flagged ``is_eagle_group`` (the EAGLE drop's groups).
    ``hash_block_size`` / ``scheduler_block_size`` default to the smallest / the least common
    multiple of the groups' block sizes.  ``encoder_tokens``: admissions pass that many
    ``num_encoder_tokens`` (cross attention).  ``spec_tokens``: decode steps schedule up to that
    many draft tokens (and ``lookahead`` slots) and reject some.  ``external``: admissions may
    pass connector tokens (``num_external_computed_tokens``, ``delay_cache_blocks``).
    ``in_flight``: steps may run with up to that many of the request's computed tokens still in
    flight (``num_in_flight_tokens``, async scheduling).  ``aligned_chunks``: a prefill chunk
    that ends before the prefill does ends on a scheduler-block boundary (Mamba align mode's
    rule in vLLM's scheduler, ``_mamba_block_aligned_split``, without its checkpoint stops).
    ``shared_prefix_checkpoint``: the manager's ``enable_mamba_shared_prefix_checkpoint``
    (it acts with EAGLE over an align-mode Mamba group with partial hits).
    ``dcp_world_size`` / ``pcp_world_size``: context parallelism (a dcp-sharded group's block
    spans ``block_size * dcp``: give the hash and scheduler block sizes).  ``pending``: a
    feature kvcy may not have yet; while kvcy's manager raises
    ``NotImplementedError`` for the config, its test skips naming it (once kvcy builds it, it
    runs like any other).  ``xfail``: a known difference from vLLM (the minimal failing
    sequence); the test is a strict xfail.
    """

    name: str
    groups: tuple
    num_blocks: int = 32
    hash_block_size: int | None = None
    scheduler_block_size: int | None = None
    enable_caching: bool = True
    use_eagle: bool = False
    num_hash_lookahead_tokens: int = 0
    num_prefill_lookahead: int = 0
    retention: int | None = None
    watermark: float = 0.0
    events: bool = True
    log_stats: bool = True
    max_model_len: int = 256
    max_in_flight_tokens: int | None = None
    encoder_tokens: int = 0
    spec_tokens: int = 0
    lookahead: int = 0
    external: bool = False
    full_sequence_must_fit: bool = False
    in_flight: int = 0
    aligned_chunks: bool = False
    pending: str | None = None
    xfail: str | None = None
    eagle_groups: tuple = ()
    shared_prefix_checkpoint: bool = False
    dcp_world_size: int = 1
    pcp_world_size: int = 1

    @property
    def block_sizes(self) -> list[int]:
        return [kw["block_size"] for _, kw in self.groups]

    @property
    def replay_tokens(self) -> int:
        """vLLM's ``prefix_replay_tokens``: the window of a bounded-replay sliding-window group."""
        return max([kw["sliding_window"] for _, kw in self.groups if kw.get("bounded_replay")], default=0)

    @property
    def hbs(self) -> int:
        return self.hash_block_size or min(self.block_sizes)

    @property
    def sbs(self) -> int:
        return self.scheduler_block_size or math.lcm(*self.block_sizes)

    def manager_kwargs(self) -> dict:
        return dict(
            max_model_len=self.max_model_len, scheduler_block_size=self.sbs, hash_block_size=self.hbs,
            max_in_flight_tokens=self.max_in_flight_tokens, enable_caching=self.enable_caching,
            use_eagle=self.use_eagle, num_hash_lookahead_tokens=self.num_hash_lookahead_tokens,
            num_prefill_lookahead=self.num_prefill_lookahead, log_stats=self.log_stats,
            enable_kv_cache_events=self.events, watermark=self.watermark,
            enable_mamba_shared_prefix_checkpoint=self.shared_prefix_checkpoint,
            dcp_world_size=self.dcp_world_size, pcp_world_size=self.pcp_world_size)


def vllm_spec(cls_name: str, kwargs: dict) -> Any:
    """vLLM's spec of that class (dtype names become torch dtypes)."""
    import torch
    from vllm.v1 import kv_cache_interface as v

    kw = dict(kwargs)
    if cls_name != "MambaSpec":
        kw = {**ATTN, **kw}
    if "dtype" in kw:
        kw["dtype"] = getattr(torch, kw["dtype"])
    if "dtypes" in kw:
        kw["dtypes"] = tuple(getattr(torch, d) for d in kw["dtypes"])
    return getattr(v, cls_name)(**kw)


def vllm_config(cfg: Config) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [KVCacheGroupSpec([f"layer{i}"], vllm_spec(name, kw), is_eagle_group=i in cfg.eagle_groups)
              for i, (name, kw) in enumerate(cfg.groups)]
    return KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                         prefix_cache_retention_interval=cfg.retention)


# ------------------------------------------------------------------ one library
class Side:
    """One library's manager and requests, behind the same calls."""

    def __init__(self, which: str, cfg: Config, kv: Any = None) -> None:
        self.which = which
        self.cfg = cfg
        if which == "vllm":
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_manager import KVCacheManager
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.request import Request, RequestStatus

            sha = get_hash_fn_by_name("sha256")
            init_none_hash(sha)
            hasher = get_request_block_hasher(cfg.hbs, sha, cfg.num_hash_lookahead_tokens)
            self.status = RequestStatus
            self.mgr = KVCacheManager(vllm_config(cfg), **cfg.manager_kwargs())

            def request(rid, toks, salt=None, session=None, report="incremental"):
                params = SamplingParams(max_tokens=4096, extra_args={"kv_cache_report_mode": report})
                return Request(rid, toks, params, None, cache_salt=salt, session_id=session, block_hasher=hasher)

            self._request = request
        else:
            import kvcy.vllm
            from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
            from kvcy.request import RequestStatus

            sha = get_hash_fn_by_name("sha256")
            init_none_hash(sha)
            hasher = get_request_block_hasher(cfg.hbs, sha, cfg.num_hash_lookahead_tokens)
            self.status = RequestStatus
            config = kvcy.vllm.convert_kv_cache_config(vllm_config(cfg))
            self.mgr = kv.KVCacheManager(config, **cfg.manager_kwargs())
            # Compared with vLLM's manager: vLLM's semantics, as the drop-in builds it (None for
            # what can never fit, hits taken as handed over).
            self.mgr.refuse_unservable = False
            self.mgr.refuse_stale_hits = False

            def request(rid, toks, salt=None, session=None, report="incremental"):
                return kv.Request(rid, toks, cache_salt=salt, session_id=session, kv_cache_report_mode=report,
                                  block_hasher=hasher)

            self._request = request
        self.reqs: dict[str, Any] = {}
        self.deferred: list[list] = []  # blocks popped by pop_blocks_for_free, not yet freed

    def new_request(self, rid: str, tokens: list[int], salt: str | None = None, session: str | None = None,
                    report: str = "incremental") -> None:
        self.reqs[rid] = self._request(rid, list(tokens), salt, session, report)

    def set_status(self, rid: str, name: str) -> None:
        self.reqs[rid].status = getattr(self.status, name)


def _ids(blocks: Any) -> list | None:
    return None if blocks is None else [list(g) for g in blocks.get_block_ids()]


def _hash(h: Any) -> Any:
    return h if h is None or isinstance(h, int) else bytes(h).hex()


def _event(e: Any) -> list:
    """An event as its type name, every field (hashes as ints or hex) and its msgpack encoding
    (what the ZeroMQ publisher sends: equal values of different types, an int for a bool or a
    float, or a default set explicitly where the other side leaves it out, encode apart)."""
    import msgspec

    out: list = [type(e).__name__, ["wire", msgspec.msgpack.encode(e).hex()]]
    for f in e.__struct_fields__:
        value = getattr(e, f)
        if f == "block_hashes":
            value = [_hash(h) for h in value]
        elif f == "parent_block_hash":
            value = _hash(value)
        elif f == "extra_keys" and value is not None:
            value = [None if k is None else list(k) for k in value]
        elif isinstance(value, (list, tuple)):
            value = [list(x) if isinstance(x, (list, tuple)) else x for x in value]
        out.append([f, value])
    return out


def _stats(s: Any) -> Any:
    if s is None:
        return None
    return [s.reset, s.requests, s.queries, s.hits, s.preempted_requests, s.preempted_queries, s.preempted_hits]


def _remaining_blocks(side: Side, req: Any) -> Any:
    """What the scheduler asks the coordinator for a request's remaining blocks
    (``Scheduler._request_remaining_blocks``, with the config's draft and lookahead slots)."""
    mgr, cfg = side.mgr, side.cfg
    full = min(req.num_tokens, cfg.max_model_len)
    num_tokens = full + (1 + cfg.spec_tokens + cfg.lookahead if cfg.spec_tokens else 0)
    try:
        return mgr.coordinator.get_num_blocks_to_allocate(
            request_id=req.request_id, num_tokens=num_tokens, new_computed_blocks=mgr.empty_kv_cache_blocks.blocks,
            num_encoder_tokens=0, total_computed_tokens=req.num_computed_tokens,
            num_local_computed_tokens=req.num_computed_tokens, num_tokens_main_model=full, apply_admission_cap=True,
            prefill_end=max(req.num_prompt_tokens, req.num_tokens - 1))
    except Exception as exc:  # (compared: both sides must refuse alike)
        return ["raised", type(exc).__name__]


def snapshot(side: Side) -> dict:
    """Everything observable of one side's manager, as plain data (takes the events, the new
    block ids, the copies, the boundary-state offloads and the prefix-cache stats)."""
    mgr = side.mgr
    pool = mgr.block_pool
    cmap = pool.cached_block_hash_to_block
    keys = sorted(bytes(k) for k in (cmap._cache.keys() if hasattr(cmap, "_cache") else cmap.keys()))
    extra = {bid: sorted(bytes(k) for k in ks) for bid, ks in pool.cached_block_hashes_by_block.items()}
    holders: dict[bytes, list[int]] = {}
    for b in pool.blocks:
        if b.block_hash is not None:
            holders.setdefault(bytes(b.block_hash), []).append(b.block_id)
    for bid, ks in extra.items():
        for k in ks:
            holders.setdefault(k, []).append(bid)
    cache_map = []
    for k in keys:
        one = cmap.get_one_block(k)
        cache_map.append([k.hex(), None if one is None else one.block_id,
                          sorted(i for i in holders.get(k, ()) if cmap.contain(k, i))])
    copies, retained = mgr.take_kv_cache_block_copies()
    return {
        "free": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "num_free": pool.get_num_free_blocks(),
        "blocks": [[b.block_id, bytes(b.block_hash).hex(), b.block_hash_num_tokens, b.ref_cnt]
                   for b in pool.blocks if b.block_hash is not None],
        "ref_cnt": [b.ref_cnt for b in pool.blocks],
        "extra": {bid: [k.hex() for k in ks] for bid, ks in extra.items()},
        "map": cache_map,
        "requests": {rid: [[list(g) for g in mgr.get_block_ids(rid)],
                           [list(g) for g in mgr.get_block_ids_for_computed_tokens(rid, r.num_computed_tokens)],
                           mgr.estimate_cached_tokens(r), _remaining_blocks(side, r)]
                     for rid, r in sorted(side.reqs.items())},
        "events": [_event(e) for e in mgr.take_events()],
        "new_block_ids": list(mgr.take_new_block_ids()),
        "copies": [[c.src_block_id, c.dst_block_id] for c in copies] + [[b.block_id for b in retained]],
        "offloads": mgr.take_boundary_state_offloads(),
        "usage": mgr.usage,
        "stats": _stats(mgr.make_prefix_cache_stats()),
    }


# ------------------------------------------------------------------ operations
@dataclasses.dataclass
class Op:
    """One scheduler-level operation, applied the same way to both sides.

    ``kind`` and its fields:

    * ``admit`` (``rid``; a new request: ``tokens``, with ``salt`` (``cache_salt``),
      ``session`` (``session_id``) and ``report_full`` (``kv_cache_report_mode="full"``,
      whose hits re-emit ``BlockStored``)): ``get_computed_blocks`` (or, with
      ``connector_lookup``, ``get_computed_blocks_for_connector``; capped by
      ``max_hit`` when set), the request's ``shared_prefix_boundary`` set from it,
      ``record_prefix_cache_stats``, then ``allocate_slots`` with the hit, ``chunk`` new tokens
      at most (less the replayed window of a bounded-replay group's hit, as vLLM's scheduler
      recomputes it), ``lookahead`` slots, ``external`` connector tokens (``delay``: loaded
      asynchronously, no new tokens), the config's encoder tokens, ``full_sequence_must_fit``,
      ``has_scheduled_reqs`` and ``skip_zeroing`` (``skip_zeroing_group_ids``).  Success makes
      the request running (or loading).
    * ``step`` (``rid``): a running request's next prefill ``chunk``; once its prompt and
      outputs are computed, a decode step: one new token (the last sampled one appended) plus
      ``drafts`` draft tokens and ``lookahead`` slots; ``accepted`` of the drafts are kept
      (the rest rolled back, then ``cache_blocks`` as the scheduler does with drafts).  No
      room: the request is preempted (``free``), as the scheduler does.  ``in_flight`` of its
      computed tokens are in flight during the step (async scheduling).
    * ``loaded`` (``rid``): an async load finished: ``cache_blocks`` up to the computed tokens,
      the request running again; ``failed``: only the scheduler-block-aligned prefix is valid
      (``cache_blocks`` and ``record_blocks_for_zeroing`` from there, or ``free`` if none).
    * ``preempt`` / ``finish`` (``rid``): ``free``; a preempted request may be admitted again.
    * ``finish_deferred`` (``rid``): ``pop_blocks_for_free`` (the scheduler's deferred free
      while a step may still write the blocks); ``drain``: the block pool frees them, in
      reverse, oldest first.
    * ``skip`` (``rid``): ``remove_skipped_blocks`` at the processed tokens, with the prompt
      length.
    * ``reset``, ``evict`` (``ids``), ``new_step``.
    """

    kind: str
    rid: str | None = None
    tokens: tuple = ()
    chunk: int = 0
    lookahead: int = 0
    external: int = 0
    delay: bool = False
    max_hit: int | None = None
    drafts: int = 0
    accepted: int = 0
    out_tokens: tuple = ()
    ids: tuple = ()
    has_scheduled: bool = True
    skip_zeroing: tuple = ()
    in_flight: int = 0
    salt: str | None = None
    session: str | None = None
    report_full: bool = False
    connector_lookup: bool = False
    failed: bool = False


def apply(side: Side, op: Op) -> Any:
    """Run ``op`` on one side; what it returned, as plain data (the exception's type name if it
    raised)."""
    try:
        return _apply(side, op)
    except Exception as exc:  # (compared: both sides must refuse alike)
        return ["raised", type(exc).__name__]


def _clip(cfg: Config, req: Any, start: int, n_new: int) -> int:
    """``n_new`` prefill tokens from ``start``, ending on a block boundary when the config
    asks for aligned chunks and the chunk stops before the prefill does."""
    prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
    end = start + n_new
    if not cfg.aligned_chunks or start >= prefill_end or end >= prefill_end:
        return n_new
    aligned = end // cfg.sbs * cfg.sbs
    if aligned <= start:
        aligned = min((start // cfg.sbs + 1) * cfg.sbs, prefill_end)
    return aligned - start


def _apply(side: Side, op: Op) -> Any:
    mgr, cfg = side.mgr, side.cfg
    kind = op.kind
    if kind == "admit":
        if op.tokens:
            side.new_request(op.rid, op.tokens, op.salt, op.session, "full" if op.report_full else "incremental")
        req = side.reqs[op.rid]
        diverged = None
        if op.connector_lookup:
            blocks, n_hit, boundary, diverged = mgr.get_computed_blocks_for_connector(req, op.max_hit)
        elif op.max_hit is None:
            blocks, n_hit, boundary = mgr.get_computed_blocks(req)
        else:
            blocks, n_hit, boundary = mgr.get_computed_blocks(req, op.max_hit)
        req.shared_prefix_boundary = boundary
        mgr.record_prefix_cache_stats(req, n_hit)
        n_ext = min(op.external, max(0, req.num_tokens - 1 - n_hit))
        if cfg.replay_tokens:  # (a load without the window ends on a block boundary)
            n_ext -= n_ext % cfg.sbs
        delay = op.delay and n_ext > 0
        # bounded replay: the hit's last window is recomputed, its KV not rewritten
        replay = 0 if delay else min(cfg.replay_tokens, n_hit + n_ext)
        start = req.num_computed_tokens + n_hit + n_ext - replay
        n_new = 0 if delay else min(op.chunk, req.num_tokens - start)
        if n_new == 0 and n_ext == 0 and n_hit == 0:
            n_new = min(max(op.chunk, 1), req.num_tokens)
        if n_new:
            n_new = _clip(cfg, req, start, n_new)
        got = mgr.allocate_slots(
            req, max(n_new - replay, 0), n_hit, blocks, num_lookahead_tokens=op.lookahead,
            num_external_computed_tokens=n_ext, delay_cache_blocks=delay,
            num_encoder_tokens=cfg.encoder_tokens, full_sequence_must_fit=cfg.full_sequence_must_fit,
            has_scheduled_reqs=op.has_scheduled, skip_zeroing_group_ids=op.skip_zeroing)
        if got is not None:
            req.num_computed_tokens = start + n_new
            side.set_status(op.rid, "WAITING_FOR_REMOTE_KVS" if delay else "RUNNING")
        return [n_hit, boundary, diverged, _ids(blocks), n_ext, n_new, _ids(got)]
    req = side.reqs.get(op.rid) if op.rid is not None else None
    if kind == "step":
        prefill_end = req.num_tokens
        if req.num_computed_tokens < prefill_end:
            n_new, drafts = min(op.chunk, prefill_end - req.num_computed_tokens), 0
            n_new = _clip(cfg, req, req.num_computed_tokens, n_new)
        else:
            req.append_output_token_ids(list(op.out_tokens[:1]))
            n_new, drafts = 1, op.drafts
        n_new = min(n_new + drafts, max(1, cfg.max_model_len - 1 - req.num_computed_tokens))
        drafts = min(drafts, n_new - 1)
        req.num_in_flight_tokens = min(op.in_flight, req.num_computed_tokens)
        got = mgr.allocate_slots(req, n_new, num_lookahead_tokens=op.lookahead)
        if got is None:
            req.num_in_flight_tokens = 0
            mgr.free(req)
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            side.set_status(op.rid, "PREEMPTED")
            return ["preempted"]
        req.num_computed_tokens += n_new
        if drafts:
            accepted = min(op.accepted, drafts)
            req.num_computed_tokens -= drafts - accepted
            if accepted:
                req.append_output_token_ids(list(op.out_tokens[1:1 + accepted]))
            mgr.cache_blocks(req, req.num_computed_tokens - req.num_in_flight_tokens)
        req.num_in_flight_tokens = 0
        return _ids(got)
    if kind == "loaded":
        if op.failed:  # the valid prefix ends at the first bad block (a scheduler-block boundary here)
            req.num_computed_tokens = req.num_computed_tokens // cfg.sbs * cfg.sbs
            if not req.num_computed_tokens:
                mgr.free(req)
                side.set_status(op.rid, "WAITING")
                return None
            mgr.cache_blocks(req, req.num_computed_tokens)
            mgr.record_blocks_for_zeroing(op.rid, req.num_computed_tokens)
        else:
            mgr.cache_blocks(req, req.num_computed_tokens)
        req.num_computed_tokens -= min(cfg.replay_tokens, req.num_computed_tokens)  # (replayed after a load)
        side.set_status(op.rid, "RUNNING")
        return None
    if kind == "finish_deferred":
        side.deferred.append(mgr.pop_blocks_for_free(req))
        del side.reqs[op.rid]
        return None
    if kind == "drain":
        while side.deferred:
            mgr.block_pool.free_blocks(reversed(side.deferred.pop(0)))
        return None
    if kind in ("preempt", "finish"):
        mgr.free(req)
        if kind == "preempt":
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            side.set_status(op.rid, "PREEMPTED")
        else:
            del side.reqs[op.rid]
        return None
    if kind == "skip":
        mgr.remove_skipped_blocks(op.rid, max(0, req.num_computed_tokens - req.num_in_flight_tokens),
                                  req.num_prompt_tokens)
        return None
    if kind == "reset":
        return mgr.reset_prefix_cache()
    if kind == "evict":
        mgr.evict_blocks(set(op.ids))
        return None
    if kind == "new_step":
        mgr.new_step_starts()
        return None
    raise ValueError(f"unknown operation {kind!r}")


# ------------------------------------------------------------------ both
class Pair:
    """vLLM's side and kvcy's (the twin ``kv``: ``kvcy._fast.load(name)["kv_cache"]``)."""

    def __init__(self, cfg: Config, kv: Any) -> None:
        self.cfg = cfg
        self.vllm = Side("vllm", cfg)
        self.kvcy = Side("kvcy", cfg, kv)

    def step(self, op: Op) -> tuple[list, list]:
        """``op`` on both sides: ``[result, snapshot]`` of each."""
        out = []
        for side in (self.vllm, self.kvcy):
            result = apply(side, op)
            out.append([result, snapshot(side)])
        return out[0], out[1]

    def request_state(self, rid: str) -> tuple:
        """vLLM's request: (status name, computed tokens, tokens, prompt tokens)."""
        req = self.vllm.reqs[rid]
        return req.status.name, req.num_computed_tokens, req.num_tokens, req.num_prompt_tokens


def first_difference(expected: Any, got: Any, path: str = "") -> str | None:
    """Where two snapshots first differ (a path and both values), or None."""
    if expected == got:
        return None
    if type(expected) is not type(got) and not (isinstance(expected, (int, float)) and isinstance(got, (int, float))):
        return f"{path}: vLLM {expected!r} != kvcy {got!r}"
    if isinstance(expected, dict):
        for k in sorted(set(expected) | set(got), key=repr):
            if k not in expected or k not in got:
                return f"{path}.{k}: vLLM {expected.get(k, '<missing>')!r} != kvcy {got.get(k, '<missing>')!r}"
            d = first_difference(expected[k], got[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(expected, list):
        if len(expected) != len(got):
            return f"{path}: vLLM {expected!r} != kvcy {got!r}"
        for i, (a, b) in enumerate(zip(expected, got)):
            d = first_difference(a, b, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if expected == got else f"{path}: vLLM {expected!r} != kvcy {got!r}"


Maker = Callable[[Config], Pair]
