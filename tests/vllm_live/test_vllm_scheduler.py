"""vLLM 0.33.0's own ``Scheduler`` on kvcy's ``KVCacheManager``: the same decisions, step by step.

Runs only where vLLM 0.33.0 imports (CI installs it into a virtual environment of its own;
see ``.ci/run``); elsewhere the whole module is skipped, unless ``KVCY_REQUIRE_VLLM=1`` makes a
missing vLLM an error.  The scenario drives vLLM's real
``Scheduler`` on the CPU (``VLLM_TARGET_DEVICE=cpu``, a config-only OPT-shaped model written
here, no weights, no hub) through a few hundred seeded requests:

* prompts built from a handful of shared prefixes, so prefix caching hits (and some prompts
  repeat whole);
* a small block pool and long enough outputs that running requests are preempted;
* two KV-cache layouts: one full-attention group, and full attention beside a sliding window
  (vLLM's hybrid coordinator);
* aborts through ``Scheduler.finish_requests`` of waiting, running and preempted requests;
* the watermark set through vLLM's ``SchedulerConfig(watermark=...)``;
* a fake model: every request that finished its prompt gets one sampled token per step
  (EOS now and then, ``max_tokens`` otherwise), fed back through ``update_from_output``.

The scenario runs once on vLLM's own ``KVCacheManager`` and once with ``kvcy.vllm.installed()``
(kvcy's manager, under whichever twin this process selected: ``KVCY_NO_EXTENSIONS``), and every
``SchedulerOutput`` must be identical: new and cached requests with their block ids per group,
token counts, preempted and finished ids, common-prefix blocks, and also what the step returned
(finish reasons, prefix-cache stats, KV usage).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import pytest

# vLLM picks its platform and looks models up when it is imported / configured: CPU, offline.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vllm  # noqa: E402

import kvcy  # noqa: E402
import kvcy.vllm  # noqa: E402

BLOCK_SIZE = 16
# KV-cache layouts the scenario runs on: one full-attention group, or a hybrid of a full-attention
# and a sliding-window group (vLLM's hybrid coordinator), or of a full-attention and a Mamba group
# in align mode hashed every 4 tokens (fine-grained partial hits, copy-on-write), or full attention
# beside a bounded-replay sliding window (the scheduler recomputes a hit's last window), or beside
# an R-SWA group and a circular buffer, each with a pool small enough to preempt.
LAYOUTS = {"full-attention": 64, "full+sliding-window": 96, "full+mamba-align": 80, "full+bounded-replay": 72,
           "full+rswa+ring": 120}  # layout -> blocks
HASH_BLOCK_SIZES = {"full+mamba-align": 4}  # layout -> hash block size (default: BLOCK_SIZE)
SLIDING_WINDOW = 48
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 12
MAX_NUM_BATCHED_TOKENS = 192
WATERMARK = 0.05
EOS = 2
VOCAB = 1000
NUM_REQUESTS = 300
SEED = 1234


# ---------------------------------------------------------------------------------------------
# vLLM configuration, a config-only model, requests
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An OPT-125m-shaped ``config.json`` (no weights, no tokenizer): all vLLM needs to configure."""
    return write_model_config(str(tmp_path_factory.mktemp("opt-config-only")))


def write_model_config(path: str, max_position_embeddings: int = 2048) -> str:
    """Writes the config-only model into ``path`` (also bench/bench_vllm_scheduler.py's model)."""
    from transformers import OPTConfig

    OPTConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        ffn_dim=128,
        num_attention_heads=4,
        max_position_embeddings=max_position_embeddings,
        architectures=["OPTForCausalLM"],
    ).save_pretrained(path)
    return path


def make_vllm_config(model_dir: str, num_blocks: int, watermark: float, mamba_align: bool = False, *,
                     max_num_seqs: int = MAX_NUM_SEQS, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                     max_model_len: int = MAX_MODEL_LEN) -> Any:
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model_config = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, dtype="float16", seed=0, max_model_len=max_model_len
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        watermark=watermark,
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True,
                               mamba_cache_mode="align" if mamba_align else "none")
    config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config)
    config.cache_config.num_gpu_blocks = num_blocks
    return config


def make_kv_cache_config(layout: str, num_blocks: int | None = None) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import (CircularBufferSpec, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            MambaSpec, RSWASpec, SlidingWindowMLASpec, SlidingWindowSpec)

    layers = [f"model.decoder.layers.{i}.self_attn.attn" for i in range(2)]
    full = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float16)
    if layout == "full-attention":
        groups = [KVCacheGroupSpec(layers, full)]
    elif layout == "full+bounded-replay":
        replay = SlidingWindowMLASpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=16, dtype=torch.float16,
                                      sliding_window=32, bounded_replay=True)
        groups = [KVCacheGroupSpec(layers[:1], full), KVCacheGroupSpec(layers[1:], replay)]
    elif layout == "full+rswa+ring":
        attn = dict(block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float16)
        groups = [KVCacheGroupSpec(layers[:1], full), KVCacheGroupSpec(layers[1:], RSWASpec(**attn, rswa_window=32)),
                  KVCacheGroupSpec(["model.decoder.ring"], CircularBufferSpec(**attn))]
    elif layout == "full+mamba-align":
        mamba = MambaSpec(block_size=BLOCK_SIZE, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="align")
        groups = [KVCacheGroupSpec(layers[:1], full), KVCacheGroupSpec(layers[1:], mamba)]
    else:
        sliding = SlidingWindowSpec(
            block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float16, sliding_window=SLIDING_WINDOW
        )
        groups = [KVCacheGroupSpec(layers[:1], full), KVCacheGroupSpec(layers[1:], sliding)]
    return KVCacheConfig(num_blocks=LAYOUTS[layout] if num_blocks is None else num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=groups)


def make_scheduler(model_dir: str, layout: str, watermark: float) -> Any:
    """A ``Scheduler`` built the way vLLM's engine core builds it (``log_stats`` on)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    config = make_vllm_config(model_dir, LAYOUTS[layout], watermark, mamba_align="mamba" in layout)
    return Scheduler(
        vllm_config=config,
        kv_cache_config=make_kv_cache_config(layout),
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZES.get(layout, BLOCK_SIZE),
        log_stats=True,
    )


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int


def make_workload(seed: int = SEED) -> list[RequestSpec]:
    """Seeded prompts with shared prefixes (and whole-prompt repeats), arriving over time."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    prefixes = [tokens(rng.randrange(8, 130)) for _ in range(8)]
    specs: list[RequestSpec] = []
    step = 0
    previous: list[tuple[int, ...]] = []
    for i in range(NUM_REQUESTS):
        if previous and rng.random() < 0.1:
            prompt = rng.choice(previous)  # the same prompt again: a full hit but the last token
        else:
            prefix = rng.choice(prefixes) if rng.random() < 0.8 else []
            prompt = tuple(prefix + tokens(rng.randrange(1 if prefix else 4, 90)))
        previous.append(prompt)
        step += rng.choice((0, 0, 1, 1, 2, 3))
        specs.append(RequestSpec(f"req-{i}", prompt, rng.randrange(1, 200), step))
    return specs


def sampled_token(seed: int, request_id: str, position: int) -> int:
    """The fake model's next token: a pure function of the request and its length, EOS at times."""
    rng = random.Random(f"{seed}/{request_id}/{position}")
    return EOS if rng.random() < 0.02 else rng.randrange(3, VOCAB)


# ---------------------------------------------------------------------------------------------
# Driving the scheduler and recording what it decided
# ---------------------------------------------------------------------------------------------


def _block_ids(block_ids: tuple[list[int], ...] | None) -> Any:
    return None if block_ids is None else tuple(tuple(group) for group in block_ids)


def record_output(out: Any) -> dict[str, Any]:
    """Everything a ``SchedulerOutput`` says about scheduling and KV blocks, as plain values."""
    cached = out.scheduled_cached_reqs
    return {
        "new": [
            (r.req_id, tuple(r.prompt_token_ids or ()), _block_ids(r.block_ids), r.num_computed_tokens)
            for r in out.scheduled_new_reqs
        ],
        "cached": {
            "req_ids": list(cached.req_ids),
            "resumed": sorted(cached.resumed_req_ids),
            "new_token_ids": [list(t) for t in cached.new_token_ids],
            "all_token_ids": {k: list(v) for k, v in sorted(cached.all_token_ids.items())},
            "new_block_ids": [_block_ids(b) for b in cached.new_block_ids],
            "num_computed_tokens": list(cached.num_computed_tokens),
            "num_output_tokens": list(cached.num_output_tokens),
        },
        "num_scheduled_tokens": dict(sorted(out.num_scheduled_tokens.items())),
        "total_num_scheduled_tokens": out.total_num_scheduled_tokens,
        "spec_decode_tokens": {k: list(v) for k, v in sorted(out.scheduled_spec_decode_tokens.items())},
        "finished": sorted(out.finished_req_ids),
        "preempted": None if out.preempted_req_ids is None else sorted(out.preempted_req_ids),
        "num_common_prefix_blocks": list(out.num_common_prefix_blocks),
        "new_block_ids_to_zero": None if out.new_block_ids_to_zero is None else list(out.new_block_ids_to_zero),
        "kv_cache_block_copies": None
        if out.kv_cache_block_copies is None
        else [(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies],
    }


_PREFIX_STATS = ("reset", "requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")


def record_engine_outputs(engine_outputs: dict[int, Any]) -> dict[str, Any]:
    """What ``update_from_output`` returned: tokens, finish reasons, stats and KV usage."""
    per_request = []
    stats = []
    for client in sorted(engine_outputs):
        outs = engine_outputs[client]
        for o in outs.outputs:
            per_request.append((o.request_id, list(o.new_token_ids), str(o.finish_reason), o.stop_reason))
        s = outs.scheduler_stats
        if s is not None:
            prefix = s.prefix_cache_stats
            stats.append(
                {
                    "running": s.num_running_reqs,
                    "waiting": s.num_waiting_reqs,
                    "skipped_waiting": s.num_skipped_waiting_reqs,
                    "kv_cache_usage": s.kv_cache_usage,
                    "prefix_cache_stats": None
                    if prefix is None
                    else {name: getattr(prefix, name) for name in _PREFIX_STATS},
                }
            )
    return {"outputs": per_request, "stats": stats}


def run_scenario(
    model_dir: str, layout: str, seed: int = SEED, watermark: float = WATERMARK, max_steps: int = 5000
) -> tuple[list[dict[str, Any]], type]:
    """Drives one fresh ``Scheduler`` through the whole workload.

    Returns:
        One record per step (and a last one of the pool's state), and the manager's class.
    """
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    scheduler = make_scheduler(model_dir, layout, watermark)
    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(HASH_BLOCK_SIZES.get(layout, BLOCK_SIZE), hash_fn)

    workload = make_workload(seed)
    rng = random.Random(seed + 1)  # aborts
    records: list[dict[str, Any]] = []
    next_request = 0
    for step in range(max_steps):
        while next_request < len(workload) and workload[next_request].arrival_step <= step:
            spec = workload[next_request]
            params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=False)
            params.update_from_generation_config({}, EOS)
            scheduler.add_request(
                Request(
                    request_id=spec.request_id,
                    prompt_token_ids=list(spec.prompt),
                    sampling_params=params,
                    pooling_params=None,
                    arrival_time=float(step),
                    block_hasher=block_hasher,
                )
            )
            next_request += 1

        aborted: list[str] = []
        live = sorted(scheduler.requests)
        if live and rng.random() < 0.08:
            aborted = rng.sample(live, k=min(len(live), rng.choice((1, 1, 2))))
            scheduler.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)

        out = scheduler.schedule()
        record = {"step": step, "aborted": aborted, "scheduler_output": record_output(out)}

        req_ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = scheduler.requests[req_id]
            if request.num_computed_tokens >= request.num_tokens:  # prompt done: one new token
                sampled.append([sampled_token(seed, req_id, request.num_tokens)])
            else:  # a partial prefill chunk samples nothing
                sampled.append([])
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        record["engine_outputs"] = record_engine_outputs(scheduler.update_from_output(out, runner_output))
        records.append(record)
        if next_request == len(workload) and not scheduler.requests:
            break
    else:  # pragma: no cover - a scheduler that never drains is itself a failure
        raise AssertionError(f"the workload did not drain in {max_steps} steps")
    records.append(
        {
            "final_usage": scheduler.kv_cache_manager.usage,
            "final_free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        }
    )
    return records, type(scheduler.kv_cache_manager)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def vllm_records(model_dir: str, layout: str) -> list[dict[str, Any]]:
    """The scenario on vLLM's own ``KVCacheManager``: the reference."""
    assert not kvcy.vllm.is_installed()
    records, manager_class = run_scenario(model_dir, layout)
    assert manager_class.__module__ == "vllm.v1.core.kv_cache_manager"
    return records


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_scenario_exercises_what_it_claims(model_dir: str, layout: str, vllm_records: list[dict[str, Any]]) -> None:
    """On vLLM's manager the workload hits the prefix cache, preempts, aborts, finishes, and the
    watermark matters."""
    steps = vllm_records[:-1]
    preempted = sum(len(r["scheduler_output"]["preempted"] or ()) for r in steps)
    aborted = sum(len(r["aborted"]) for r in steps)
    hits = sum(s["prefix_cache_stats"]["hits"] for r in steps for s in r["engine_outputs"]["stats"])
    resumed = sum(len(r["scheduler_output"]["cached"]["resumed"]) for r in steps)
    reasons = {o[2] for r in steps for o in r["engine_outputs"]["outputs"]}
    print(
        f"vLLM 0.33.0 run ({layout}): {len(steps)} steps, {preempted} preemptions, {resumed} resumptions, "
        f"{aborted} aborts, {hits} prefix-cache hit tokens, finish reasons {sorted(reasons)}"
    )
    assert preempted >= 5 and resumed >= 5
    assert aborted >= 5
    assert hits >= 20 * BLOCK_SIZE
    assert {"stop", "length"} <= reasons
    assert vllm_records[-1]["final_free_blocks"] == LAYOUTS[layout] - 1  # every block back (less the null block)
    if layout == "full+mamba-align":  # hits ending inside a block: their shared block is copied
        assert sum(len(r["scheduler_output"]["kv_cache_block_copies"] or ()) for r in steps) >= 20
    # The watermark changes decisions here: without it vLLM schedules differently.
    no_watermark, _ = run_scenario(model_dir, layout, watermark=0.0)
    assert no_watermark != vllm_records


def _first_difference(expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> str:
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            keys = sorted(k for k in a if a.get(k) != b.get(k))
            detail = {k: (a.get(k), b.get(k)) for k in keys}
            return f"record {i} differs in {keys}: (vLLM, kvcy) = {detail!r}"[:4000]
    return f"vLLM ran {len(expected)} records, kvcy {len(got)}"


def missing_scheduler_api() -> list[str]:
    """What vLLM 0.33.0's Scheduler uses in this scenario and kvcy's ``KVCacheManager`` lacks.

    The list is the one docs/vllm-dropin-gaps.md records (found by running this scenario on a
    proxy of vLLM's manager). Keywords are read from the pure twin's signature (a compiled
    ``__init__`` hides its own; tests/twins/test_twin_parity.py keeps the two the same).
    """
    import inspect

    from kvcy import _fast
    from kvcy.kv_cache_manager import KVCacheManager

    missing = []
    init = inspect.signature(_fast.load("python")["kv_cache"].KVCacheManager.__init__).parameters
    for keyword in ("num_hash_lookahead_tokens", "num_prefill_lookahead", "enable_mamba_shared_prefix_checkpoint"):
        if keyword not in init:
            missing.append(f"KVCacheManager({keyword}=...)")
    for method, keyword in (
        ("get_computed_blocks", "max_cache_hit_length"),
        ("allocate_slots", "skip_zeroing_group_ids"),
    ):
        if keyword not in inspect.signature(getattr(KVCacheManager, method)).parameters:
            missing.append(f"{method}({keyword}=...)")
    for method in ("record_prefix_cache_stats", "estimate_cached_tokens", "take_new_block_ids",
                   "take_kv_cache_block_copies", "take_boundary_state_offloads"):
        if not hasattr(KVCacheManager, method):
            missing.append(f"{method}()")
    return missing


_MISSING = missing_scheduler_api()


# Strict, and only for the errors a missing name raises: once the twins have the whole surface
# the marker lifts itself, and a different SchedulerOutput is a failure, never an expected one.
@pytest.mark.xfail(
    bool(_MISSING),
    reason=f"kvcy's KVCacheManager lacks what vLLM's Scheduler calls: {', '.join(_MISSING)}",
    raises=(TypeError, AttributeError),
    strict=True,
)
def test_scheduler_outputs_identical_on_kvcy(model_dir: str, layout: str, vllm_records: list[dict[str, Any]]) -> None:
    """Every step's ``SchedulerOutput`` (and what it returned) is the same on kvcy's manager."""
    print(f"kvcy.IMPLEMENTATION = {kvcy.IMPLEMENTATION}")
    if os.environ.get("KVCY_NO_EXTENSIONS") == "1":
        assert kvcy.IMPLEMENTATION == "python"
    elif os.environ.get("KVCY_REQUIRE_EXTENSIONS") == "1":
        assert kvcy.IMPLEMENTATION == "cython"
    with kvcy.vllm.installed():
        kvcy_records, manager_class = run_scenario(model_dir, layout)
    assert manager_class.__module__.startswith("kvcy._fast."), manager_class
    assert not kvcy.vllm.is_installed()
    assert kvcy_records == vllm_records, _first_difference(vllm_records, kvcy_records)


def test_dropin_manager_gives_vllms_none_for_what_never_fits(model_dir: str) -> None:
    """Under vLLM's Scheduler an allocation bigger than the whole pool gets None, as from vLLM's
    manager, not kvcy's ValueError (the scheduler's engine sizes pools so that none occurs)."""
    with kvcy.vllm.installed():
        scheduler = make_scheduler(model_dir, "full-attention", 0.0)
    manager = scheduler.kv_cache_manager
    assert manager.refuse_unservable is False
    request = kvcy.Request("too-long", list(range(LAYOUTS["full-attention"] * 64)))
    assert manager.allocate_slots(request, request.num_tokens) is None


# ---------------------------------------------------------------------------------------------
# kvcy.vllm's switch and conversions
# ---------------------------------------------------------------------------------------------


def test_install_rebinds_only_the_schedulers_manager_name() -> None:
    from vllm.v1.core import kv_cache_manager as vllm_kv_cache_manager
    from vllm.v1.core.sched import scheduler as scheduler_module

    vllm_class = vllm_kv_cache_manager.KVCacheManager
    assert scheduler_module.KVCacheManager is vllm_class and not kvcy.vllm.is_installed()
    try:
        kvcy.vllm.install()
        kvcy.vllm.install()  # idempotent
        assert scheduler_module.KVCacheManager is kvcy.vllm.make_kv_cache_manager
        assert vllm_kv_cache_manager.KVCacheManager is vllm_class  # vLLM's own module untouched
        assert kvcy.vllm.is_installed()
        with kvcy.vllm.installed():  # already on: stays on after the block
            pass
        assert scheduler_module.KVCacheManager is kvcy.vllm.make_kv_cache_manager
    finally:
        kvcy.vllm.uninstall()
    assert scheduler_module.KVCacheManager is vllm_class and not kvcy.vllm.is_installed()
    kvcy.vllm.uninstall()  # a no-op
    with kvcy.vllm.installed():
        assert scheduler_module.KVCacheManager is kvcy.vllm.make_kv_cache_manager
    assert scheduler_module.KVCacheManager is vllm_class


def test_install_refuses_to_replace_another_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.core.sched import scheduler as scheduler_module

    def someone_elses(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("not called")

    monkeypatch.setattr(scheduler_module, "KVCacheManager", someone_elses)
    with pytest.raises(RuntimeError, match="neither vLLM's nor kvcy's"):
        kvcy.vllm.install()
    assert scheduler_module.KVCacheManager is someone_elses and not kvcy.vllm.is_installed()


def test_general_plugin_loads_through_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own plugin loader finds kvcy's entry point (where kvcy is installed as a package)."""
    from importlib.metadata import entry_points

    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    if "kvcy" not in {ep.name for ep in entry_points(group=DEFAULT_PLUGINS_GROUP)}:
        pytest.skip("kvcy is not installed as a distribution here (its entry points are not registered)")
    monkeypatch.setenv("VLLM_PLUGINS", "kvcy")
    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert plugins["kvcy"] is kvcy.vllm.load_general_plugin
    try:
        plugins["kvcy"]()
        assert kvcy.vllm.is_installed()
    finally:
        kvcy.vllm.uninstall()


def _vllm_specs() -> dict[str, Any]:
    import torch
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1 import kv_cache_interface as v

    full = v.FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16)
    return {
        "full": full,
        "full-sliding": v.FullAttentionSpec(
            block_size=16, num_kv_heads=4, head_size=64, head_size_v=32, dtype=torch.float16, sliding_window=128
        ),
        "non-causal": v.FullAttentionSpec(
            block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16, non_causal=True
        ),
        "aligned": v.FullAttentionSpec(
            block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16, block_stride_alignment=4096
        ),
        "aligned-kernel": v.SlidingWindowSpec(
            block_size=64, num_kv_heads=4, head_size=64, dtype=torch.float16, sliding_window=96,
            block_stride_alignment=MultipleOf(16),
        ),
        "fp8": v.FullAttentionSpec(
            block_size=32, num_kv_heads=2, head_size=128, dtype=torch.uint8, kv_quant_mode=v.KVQuantMode.FP8_PER_TENSOR
        ),
        "sliding": v.SlidingWindowSpec(
            block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16, sliding_window=96
        ),
        "sliding-extra": v.SlidingWindowSpec(
            block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16, sliding_window=96,
            extra_retained_tokens=16,
        ),
        "chunked": v.ChunkedLocalAttentionSpec(
            block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16, attention_chunk_size=256
        ),
        "mla": v.MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16),
        "mla-fp8-ds": v.MLAAttentionSpec(
            block_size=64, num_kv_heads=1, head_size=656, dtype=torch.uint8, cache_dtype_str="fp8_ds_mla"
        ),
        "sliding-mla": v.SlidingWindowMLASpec(
            block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, sliding_window=128
        ),
        "cross": v.CrossAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16),
        "encoder-only": v.EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16),
        "sink": v.SinkFullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16, sink_len=4),
        "mamba": v.MambaSpec(block_size=16, shapes=((4, 8), (2, 3)), dtypes=(torch.float32, torch.bfloat16)),
        "uniform": v.UniformTypeKVCacheSpecs(
            block_size=16,
            kv_cache_specs={
                "a": full,
                "b": v.FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=torch.bfloat16),
            },
        ),
    }


@pytest.mark.parametrize("name", list(_vllm_specs()))
def test_specs_convert_field_by_field(name: str) -> None:
    spec = _vllm_specs()[name]
    converted = kvcy.vllm.convert_kv_cache_spec(spec)
    assert type(converted).__name__ == type(spec).__name__
    assert type(converted) is getattr(kvcy.kv_cache_interface, type(spec).__name__)
    assert converted.block_size == spec.block_size
    assert converted.page_size_bytes == spec.page_size_bytes
    for field in ("num_kv_heads", "head_size", "sliding_window", "attention_chunk_size", "cache_dtype_str", "sink_len",
                  "shapes", "page_size_padded", "dcp_sharded", "non_causal", "extra_retained_tokens"):
        if hasattr(spec, field):
            assert getattr(converted, field) == getattr(spec, field), field
    if hasattr(spec, "kv_quant_mode"):
        assert converted.kv_quant_mode.name == spec.kv_quant_mode.name
    assert repr(converted.block_stride_alignment) == repr(spec.block_stride_alignment)
    assert converted.get_block_stride_alignment() == spec.get_block_stride_alignment()
    assert converted.block_table_token_alignment == spec.block_table_token_alignment
    if hasattr(spec, "dtype"):
        assert converted.dtype is spec.dtype  # a torch.dtype is kept as given
    if name == "uniform":
        assert set(converted.kv_cache_specs) == {"a", "b"}
        assert converted.get_max_layers_per_page_size() == spec.get_max_layers_per_page_size()
        assert converted.uses_slot_mapping == spec.uses_slot_mapping
        assert all(type(s) is getattr(kvcy.kv_cache_interface, type(s).__name__)
                   for s in converted.kv_cache_specs.values())


def test_unsupported_specs_and_options_raise_naming_the_feature() -> None:
    import torch
    from vllm.v1 import kv_cache_interface as v

    attn = {"block_size": 16, "num_kv_heads": 4, "head_size": 64, "dtype": torch.float16}
    # (RSWASpec, CircularBufferSpec and bounded replay convert: tests/test_rswa_ring_replay.py;
    # the HiSparse specs convert too, and the manager refuses them: tests/test_hisparse_vllm.py)
    cases = []

    @dataclass(frozen=True, kw_only=True)
    class ModelsOwnSpec(v.FullAttentionSpec):
        pass

    cases.append((ModelsOwnSpec(**attn), "ModelsOwnSpec"))
    for spec, feature in cases:
        with pytest.raises(NotImplementedError, match=feature):
            kvcy.vllm.convert_kv_cache_spec(spec)

    # A Mamba group in align mode converts (the spec is vLLM's), and the manager the
    # scheduler would build takes it, with or without prefix caching.
    mamba = v.MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="align")
    assert kvcy.vllm.convert_kv_cache_spec(mamba).mamba_cache_mode == "align"
    config = v.KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[v.KVCacheGroupSpec(["m"], mamba)])
    for caching in (True, False):
        made = kvcy.vllm.make_kv_cache_manager(config, max_model_len=256, scheduler_block_size=16,
                                               hash_block_size=16, enable_caching=caching)
        assert made.coordinator.single_type_managers[0].mamba_cache_mode == "align"
    with pytest.raises(TypeError, match="expected a vLLM KVCacheSpec"):
        kvcy.vllm.convert_kv_cache_spec(kvcy.FullAttentionSpec(**attn))

    spec = v.FullAttentionSpec(**attn)
    group = v.KVCacheGroupSpec(["l0"], spec, role=v.KVCacheGroupRole.HISPARSE_SOURCE)
    assert kvcy.vllm.convert_kv_cache_group_spec(group).role.value == "hisparse_source"
    groups = [v.KVCacheGroupSpec(["l0"], spec)]
    hisparse = (
        {"hisparse_host_num_blocks": 8},
        {"hisparse_shared_host_pool": True},
        {"hisparse_host_block_stride": 64},
    )
    for option in hisparse:
        config = v.KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups, **option)
        (name, value), = option.items()
        assert getattr(kvcy.vllm.convert_kv_cache_config(config), name) == value


def test_config_converts_groups_tensors_and_settings() -> None:
    import torch
    from vllm.v1 import kv_cache_interface as v

    full = v.FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16)
    sliding = v.SlidingWindowSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16, sliding_window=64)
    page = full.page_size_bytes
    config = v.KVCacheConfig(
        num_blocks=100,
        kv_cache_tensors=[v.KVCacheTensor(size=2 * 100 * page, layers=["l0", "l1"], layer_stride=100 * page,
                                          block_stride=page)],
        kv_cache_groups=[
            v.KVCacheGroupSpec(["l0"], full),
            v.KVCacheGroupSpec(["l1"], sliding, is_eagle_group=True, enable_kv_transfer=False),
        ],
        prefix_cache_retention_interval=None,
        kv_cache_layout="NHD",
        hash_block_size=16,
        cache_hit_alignment_tokens=16,
    )
    converted = kvcy.vllm.convert_kv_cache_config(config)
    assert isinstance(converted, kvcy.KVCacheConfig)
    assert converted.num_blocks == 100
    (tensor,) = converted.kv_cache_tensors
    assert (tensor.size, tensor.layers, tensor.layer_stride, tensor.block_stride, tensor.offset) == (
        2 * 100 * page, ["l0", "l1"], 100 * page, page, 0)
    assert [g.layer_names for g in converted.kv_cache_groups] == [["l0"], ["l1"]]
    groups = converted.kv_cache_groups
    assert [type(g.kv_cache_spec).__name__ for g in groups] == ["FullAttentionSpec", "SlidingWindowSpec"]
    assert [(g.is_eagle_group, g.enable_kv_transfer) for g in groups] == [(False, True), (True, False)]
    assert all(g.role is kvcy.kv_cache_interface.KVCacheGroupRole.DEFAULT for g in groups)
    assert (converted.kv_cache_layout, converted.hash_block_size, converted.cache_hit_alignment_tokens,
            converted.kv_tp_replicas) == ("NHD", 16, 16, 1)
    assert converted.prefix_cacheable_group_ids == config.prefix_cacheable_group_ids == (0,)
