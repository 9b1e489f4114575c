"""A serving loop on kvcy, end to end, with a real (tiny) model.

Continuous batching the way vLLM's v1 engine does it, cut down to what a reader
needs to see: a scheduler that owns the requests and drives kvcy's
``KVCacheManager`` (admission with prefix-cache hits, chunked prefill, decode,
preemption and re-admission, finishing), and a worker that owns the paged KV
cache and the block tables (``kvcy.block_table``), writes each step's new keys
and values with ``kvcy.ops.reshape_and_cache`` through the slot mapping, and
runs attention over the paged cache through the block table.

The model is a Llama-architecture decoder built from ``transformers``' config
classes with seeded random weights (nothing is downloaded).  With ``--check``
the same prompts go through ``transformers``' own ``generate`` (greedy, its own
contiguous cache, same weights) and any differing token is an error: tokens
served from the prefix cache were never recomputed here, so equal outputs show
that the KV the manager handed back was the right KV.

    python examples/serving_loop.py --check                     # full attention
    python examples/serving_loop.py --check --layout full+swa   # beside a sliding window
    KVCY_NO_EXTENSIONS=1 python examples/serving_loop.py --check  # pure-Python manager, torch ops

Needs ``pip install -e ".[examples]"`` (transformers).
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import kvcy
import kvcy.ops
from kvcy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
    RequestStatus,
    SlidingWindowSpec,
)
from kvcy.block_table import MultiGroupBlockTable
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash

NUM_LAYERS, HIDDEN, HEADS, KV_HEADS, VOCAB = 2, 64, 4, 2, 512
HEAD_SIZE = HIDDEN // HEADS


# --------------------------------------------------------------------------- the model
def build_model(layout: str, window: int, seed: int, device: str) -> torch.nn.Module:
    """Two decoder layers with seeded random weights.  ``full``: Llama; ``full+swa``:
    the same architecture (Qwen2's flavour of it) with layer 1 on a sliding window."""
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                  num_hidden_layers=NUM_LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                  max_position_embeddings=1024, initializer_range=0.5, tie_word_embeddings=False)
    torch.manual_seed(seed)
    if layout == "full":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=True, sliding_window=window,
                                             layer_types=["full_attention", "sliding_attention"]))
    return model.to(device).eval()


def layer_windows(layout: str, window: int) -> list[int | None]:
    return [None] * NUM_LAYERS if layout == "full" else [None, window]


# --------------------------------------------------------------------------- the cache
def build_manager(layout: str, window: int, num_blocks: int, block_size: int, max_model_len: int) -> KVCacheManager:
    """One KV-cache group per attention kind, all drawing on one pool of blocks."""
    full = FullAttentionSpec(block_size=block_size, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, dtype="float32")
    if layout == "full":
        groups = [KVCacheGroupSpec([f"model.layers.{i}" for i in range(NUM_LAYERS)], full)]
    else:
        swa = SlidingWindowSpec(block_size=block_size, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE,
                                dtype="float32", sliding_window=window)
        groups = [KVCacheGroupSpec(["model.layers.0"], full), KVCacheGroupSpec(["model.layers.1"], swa)]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(config, max_model_len=max_model_len, scheduler_block_size=block_size,
                          hash_block_size=block_size, log_stats=True, enable_kv_cache_events=True)


class Worker:
    """What runs the model: the paged KV cache, the block tables, the forward pass.

    The cache is ``[layers, blocks, kv heads, block size, head size]`` for keys and
    one more for values.  Every group draws its block ids from the same pool, so
    each layer indexes its own slice with its group's ids.  Block-table row ``i``
    belongs to the ``i``-th request of the running batch.
    """

    def __init__(self, model, layout, window, num_blocks, block_size, max_reqs, max_tokens, max_model_len, device):
        self.model, self.block_size, self.device = model, block_size, torch.device(device)
        self.windows = layer_windows(layout, window)
        self.layer_group = [0] * NUM_LAYERS if layout == "full" else [0, 1]
        num_groups = max(self.layer_group) + 1
        shape = (NUM_LAYERS, num_blocks, KV_HEADS, block_size, HEAD_SIZE)
        self.key_cache = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.value_cache = torch.zeros(shape, dtype=torch.float32, device=self.device)
        max_blocks = -(-max_model_len // block_size)
        self.tables = MultiGroupBlockTable(max_reqs, max_tokens, self.device.type == "cuda", self.device,
                                           [block_size] * num_groups, [max_blocks] * num_groups)

    # Row bookkeeping: the scheduler says which request sits in which row.
    def set_row(self, row: int, block_ids: tuple[list[int], ...]) -> None:
        self.tables.add_row(block_ids, row)

    def append_to_row(self, row: int, block_ids: tuple[list[int], ...]) -> None:
        self.tables.append_row(block_ids, row)

    def remove_row(self, row: int, last_row: int) -> None:
        """Drop ``row``, moving the last row into the hole (the batch stays dense)."""
        self.tables.clear_row(row)
        if row != last_row:
            self.tables.move_row(last_row, row)

    @torch.inference_mode()
    def execute(self, batch: list[tuple[int, list[int], int]]) -> dict[int, int]:
        """One forward pass over ``(row, token ids, first position)`` per request; by row,
        the greedy next token after each request's last scheduled token."""
        num_reqs = max(row for row, _, _ in batch) + 1
        counts = [0] * num_reqs
        tokens_by_row: dict[int, tuple[list[int], int]] = {}
        for row, tokens, start in batch:
            counts[row], tokens_by_row[row] = len(tokens), (tokens, start)
        # Tokens in row order (rows without work this step have none).
        input_ids, positions = [], []
        for row in range(num_reqs):
            if row in tokens_by_row:
                tokens, start = tokens_by_row[row]
                input_ids += tokens
                positions += range(start, start + len(tokens))
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32, device=self.device)
        query_start_loc[1:] = torch.tensor(counts, device=self.device).cumsum(0)
        self.tables.commit_block_table(num_reqs)
        self.tables.compute_slot_mapping(num_reqs, query_start_loc, pos)
        slot_mappings = [t.slot_mapping.gpu[: len(input_ids)] for t in self.tables.block_tables]

        m = self.model.model
        hidden = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(hidden, pos[None])
        for layer_idx, layer in enumerate(m.layers):
            residual = hidden
            x = layer.input_layernorm(hidden)
            attn = layer.self_attn
            q = attn.q_proj(x).view(-1, HEADS, HEAD_SIZE)
            k = attn.k_proj(x).view(-1, KV_HEADS, HEAD_SIZE)
            v = attn.v_proj(x).view(-1, KV_HEADS, HEAD_SIZE)
            q, k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
            q, k = q[0].transpose(0, 1), k[0].transpose(0, 1)
            group = self.layer_group[layer_idx]
            # The new tokens' K/V into the paged cache, then attention reads it back.
            kvcy.ops.reshape_and_cache(k.contiguous(), v, self.key_cache, self.value_cache,
                                       slot_mappings[group], layer=layer_idx)
            out = self._paged_attention(q, pos, query_start_loc, layer_idx, group)
            hidden = residual + attn.o_proj(out.reshape(-1, HEADS * HEAD_SIZE))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        rows = sorted(tokens_by_row)
        last = query_start_loc[1:].long()[rows] - 1
        logits = self.model.lm_head(m.norm(hidden[last]))
        return dict(zip(rows, logits.argmax(-1).tolist()))

    def _paged_attention(self, q, pos, query_start_loc, layer_idx, group):
        """Each request's queries against the keys of its positions ``0..p`` (or the
        window before ``p``), gathered from the paged cache through the block table."""
        table = self.tables[group].get_device_tensor(len(query_start_loc) - 1)
        bs, window = self.block_size, self.windows[layer_idx]
        # [blocks, block size, heads, head size] flattened to one row per slot.
        keys = self.key_cache[layer_idx].transpose(1, 2).reshape(-1, KV_HEADS, HEAD_SIZE)
        values = self.value_cache[layer_idx].transpose(1, 2).reshape(-1, KV_HEADS, HEAD_SIZE)
        out = torch.empty_like(q)
        bounds = query_start_loc.tolist()
        for row in range(len(bounds) - 1):
            lo, hi = bounds[row], bounds[row + 1]
            if lo == hi:
                continue
            first, last = int(pos[lo]), int(pos[hi - 1])
            oldest = 0 if window is None else max(0, first - window + 1)
            kpos = torch.arange(oldest, last + 1, device=q.device)
            slots = table[row, kpos // bs].long() * bs + kpos % bs
            k = keys[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = values[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
            qpos = pos[lo:hi, None]
            mask = kpos[None] <= qpos
            if window is not None:
                mask &= kpos[None] > qpos - window
            out[lo:hi] = torch.nn.functional.scaled_dot_product_attention(
                q[lo:hi].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
            ).transpose(0, 1)
        return out


# --------------------------------------------------------------------------- the scheduler
class Scheduler:
    """FCFS continuous batching over one token budget per step, as vLLM's scheduler:
    running requests first (preempting the newest when the pool runs dry), then
    admissions while the budget, the batch and the pool allow."""

    def __init__(self, manager: KVCacheManager, worker: Worker, max_reqs: int, token_budget: int, max_tokens: int):
        self.manager, self.worker = manager, worker
        self.max_reqs, self.token_budget, self.max_tokens = max_reqs, token_budget, max_tokens
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []  # running[i] sits in block-table row i
        self.finished: list[Request] = []
        self.hit_tokens = self.computed_tokens = self.preemptions = self.steps = 0
        self.events = collections.Counter()

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def _remove_running(self, request: Request) -> None:
        row, last = self.running.index(request), len(self.running) - 1
        self.worker.remove_row(row, last)
        self.running[row] = self.running[last]
        self.running.pop()

    def _preempt(self, request: Request) -> None:
        # Everything the request held goes back to the pool (its full blocks stay
        # cached, so re-admission usually hits them); it starts over from token 0.
        self.manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self._remove_running(request)
        self.waiting.appendleft(request)
        self.preemptions += 1

    def step(self) -> None:
        budget = self.token_budget
        scheduled: dict[str, int] = {}
        preempted = False
        # 1. Running requests: the rest of a chunked prefill, or one decode token.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            new_blocks = self.manager.allocate_slots(request, n)
            while new_blocks is None:  # the pool is dry: the newest request gives way
                victim = self.running[-1]
                budget += scheduled.pop(victim.request_id, 0)
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
                new_blocks = self.manager.allocate_slots(request, n)
            if new_blocks is None:
                break
            self.worker.append_to_row(i, new_blocks.get_block_ids())
            scheduled[request.request_id] = n
            budget -= n
            i += 1
        # 2. Admissions (none in a step that had to preempt).
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_reqs:
            request = self.waiting[0]
            hits, num_hits, _ = self.manager.get_computed_blocks(request)
            n = min(request.num_tokens - num_hits, budget)
            new_blocks = self.manager.allocate_slots(request, n, num_new_computed_tokens=num_hits,
                                                     new_computed_blocks=hits)
            if new_blocks is None:
                break
            self.waiting.popleft()
            self.manager.record_prefix_cache_stats(request, num_hits)
            request.num_computed_tokens = num_hits  # served from the cache: never computed here
            request.status = RequestStatus.RUNNING
            self.hit_tokens += num_hits
            self.running.append(request)
            self.worker.set_row(len(self.running) - 1, self.manager.get_block_ids(request.request_id))
            scheduled[request.request_id] = n
            budget -= n
        if not scheduled:
            raise RuntimeError("nothing could be scheduled: the pool is too small for one request")
        self._execute(scheduled)
        for event in self.manager.take_events():  # what a KV-aware router would be sent
            self.events[type(event).__name__] += 1

    def _execute(self, scheduled: dict[str, int]) -> None:
        batch = []
        for row, request in enumerate(self.running):
            n = scheduled.get(request.request_id, 0)
            if n:
                start = request.num_computed_tokens
                batch.append((row, request.all_token_ids[start:start + n], start))
        next_tokens = self.worker.execute(batch)
        self.steps += 1
        for row, request in enumerate(list(self.running)):  # (rows as the batch had them)
            n = scheduled.get(request.request_id, 0)
            if not n:
                continue
            token = next_tokens[row]
            # The caller advances the computed count: the manager never does.
            request.num_computed_tokens += n
            self.computed_tokens += n
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk: the token after it is not sampled
            request.append_output_token_ids(token)
            if request.num_output_tokens >= self.max_tokens:
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.manager.free(request)
                self._remove_running(request)
                self.finished.append(request)

    def run(self) -> None:
        while self.waiting or self.running:
            self.step()


# --------------------------------------------------------------------------- the prompts
def make_prompts(num: int, seed: int) -> list[list[int]]:
    """Prompts sharing a few system prefixes (and some repeated outright)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randrange(12, 40))] for _ in range(4)]
    prompts = []
    for i in range(num):
        if i % 8 == 7:
            prompts.append(list(prompts[rng.randrange(len(prompts))]))
        else:
            prompts.append(rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 24))])
    return prompts


def serve(args: argparse.Namespace, layout: str) -> int:
    """Serve the prompts on one layout; with ``--check``, the number of failures."""
    max_model_len = 128
    model = build_model(layout, args.window, args.seed, args.device)
    manager = build_manager(layout, args.window, args.num_blocks, args.block_size, max_model_len)
    worker = Worker(model, layout, args.window, args.num_blocks, args.block_size, args.max_reqs,
                    args.max_batched_tokens, max_model_len, args.device)
    scheduler = Scheduler(manager, worker, args.max_reqs, args.max_batched_tokens, args.max_tokens)

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(args.block_size, hash_fn)
    prompts = make_prompts(args.requests, args.seed)
    requests = [Request(f"req-{i}", prompt, args.max_tokens, block_hasher=hasher) for i, prompt in enumerate(prompts)]
    for request in requests:
        scheduler.add(request)
    t0 = time.perf_counter()
    scheduler.run()
    elapsed = time.perf_counter() - t0

    stats = manager.make_prefix_cache_stats()
    print(f"manager {kvcy.IMPLEMENTATION}, ops {kvcy.ops.IMPLEMENTATION}, layout {layout}, "
          f"device {args.device}: {len(requests)} requests in {scheduler.steps} steps, {elapsed:.2f} s")
    print(f"  tokens computed {scheduler.computed_tokens}, served from the prefix cache {scheduler.hit_tokens} "
          f"(never recomputed); preemptions {scheduler.preemptions}")
    print(f"  prefix-cache stats: {stats.requests} first lookups hit {stats.hits} of {stats.queries} tokens, "
          f"{stats.preempted_requests} re-admissions hit {stats.preempted_hits} of {stats.preempted_queries}")
    print(f"  KV events: {dict(scheduler.events)}; pool usage at the end {manager.usage:.2f}")
    if not args.check:
        return 0

    mismatches = 0
    for request, prompt in zip(requests, prompts):
        ids = torch.tensor([prompt], device=args.device)
        with torch.inference_mode():
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_tokens,
                                      do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        if expected != request.output_token_ids:
            mismatches += 1
            print(f"  MISMATCH {request.request_id}: kvcy {request.output_token_ids} transformers {expected}")
    print(f"check: {len(requests) - mismatches}/{len(requests)} requests token-identical to transformers' generate")
    if scheduler.hit_tokens == 0 or scheduler.preemptions == 0:
        print("check: no prefix-cache hits or no preemptions: the run proves less than it should (shrink the pool)")
        return mismatches + 1
    return mismatches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=8, help="output tokens per request")
    p.add_argument("--layout", choices=("full", "full+swa", "both"), default="full",
                   help="full attention; layer 1 on a sliding window; or one run of each")
    p.add_argument("--window", type=int, default=12, help="sliding window of layer 1 (full+swa)")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--num-blocks", type=int, default=48, help="pool size, null block included")
    p.add_argument("--max-batched-tokens", type=int, default=48, help="token budget of one step")
    p.add_argument("--max-reqs", type=int, default=8, help="running requests at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--check", action="store_true", help="compare every token with transformers' generate")
    args = p.parse_args(argv)
    layouts = ("full", "full+swa") if args.layout == "both" else (args.layout,)
    failures = sum(serve(args, layout) for layout in layouts)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
