"""The replay's CPU tier (``kvcy replay --cpu-offload``): hits, stores, loads, both twins, the CLI."""

from __future__ import annotations

import json
import types

import pytest

from kvcy import _fast
from kvcy.sim import offload as offload_mod
from kvcy.sim.cli import main
from kvcy.sim.offload import cpu_blocks_from_spec
from kvcy.sim.scheduler import CPU_STORE_REFUSED, Divergence, ReplayConfig, replay
from kvcy.sim.synthetic import SyntheticConfig, synthetic_trace
from kvcy.sim.traces import Trace, TraceRequest, fresh_tokens

BOTH = "cython" in _fast.available() and not _fast.NO_EXTENSIONS
needs_both = pytest.mark.skipif(not BOTH, reason="compiled twins not built (or KVCY_NO_EXTENSIONS=1)")


def _far_apart(prompts_outputs) -> Trace:
    """Requests one simulated hour apart: each finishes before the next arrives."""
    return Trace("hand", [
        TraceRequest(f"q{i}", i * 3.6e6, len(p), len(o), prompt=p, output=o, index=i)
        for i, (p, o) in enumerate(prompts_outputs)
    ])


@pytest.fixture(scope="module")
def evicted_then_back() -> Trace:
    """A's prompt, then B (which evicts every GPU block A cached), then A's prompt again."""
    a = fresh_tokens(b"a", 100)
    return _far_apart([
        (a, fresh_tokens(b"oa", 4)),
        (fresh_tokens(b"b", 240), fresh_tokens(b"ob", 4)),
        (a, fresh_tokens(b"oc", 4)),
    ])


class _Recording:
    """Wraps a twin's ``CPUOffloadingManager``, counting the calls the replay makes."""

    made: list[_Recording] = []

    def __init__(self, cls, **kwargs):
        self.inner = cls(**kwargs)
        self.calls: dict[str, int] = {}
        self.finished: list[str] = []
        self.contexts: dict[str, object] = {}
        _Recording.made.append(self)

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            if name == "on_request_finished":
                self.finished.append(args[0].req_id)
            if name == "on_new_request":
                self.contexts[args[0].req_id] = args[0]
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def recording(monkeypatch):
    real = offload_mod.offload_twin

    def twin(impl):
        name, module = real(impl)
        return name, types.SimpleNamespace(
            CPUOffloadingManager=lambda **kw: _Recording(module.CPUOffloadingManager, **kw)
        )

    monkeypatch.setattr(offload_mod, "offload_twin", twin)
    monkeypatch.setattr(_Recording, "made", [])
    return _Recording


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_prompt_evicted_from_the_gpu_is_loaded_from_the_cpu_tier(impl, evicted_then_back, policy, recording):
    cfg = ReplayConfig(num_blocks=17, block_size=16)  # 16 usable blocks, 256 tokens
    gpu_only = replay(evicted_then_back, cfg, impl.name)
    assert gpu_only.hit_tokens == 0  # B took every block A had cached
    assert gpu_only.offload_impl is None and gpu_only.cpu_hit_tokens == 0

    res = replay(evicted_then_back, ReplayConfig(**{**cfg.__dict__, "cpu_offload_blocks": 64,
                                                    "offload_policy": policy}), impl.name)
    # A stores its 6 full prompt blocks (100 tokens), B its 15 (240 tokens); A's prompt comes back: its
    # first 6 blocks are loaded, never the block of its last token (the 100th: 99 // 16 = 6 blocks).
    assert (res.hit_tokens, res.cpu_hit_tokens, res.query_tokens) == (0, 96, 440)
    assert res.total_hit_rate == pytest.approx(96 / 440)
    assert (res.cpu_blocks_stored, res.cpu_blocks_loaded, res.cpu_evictions, res.cpu_stores_refused) == (21, 6, 0, 0)
    assert res.free_blocks_at_end == cfg.num_blocks - 1 and res.finished == 3
    assert res.offload_impl in ("cython", "python")
    assert len(res.offload_step_ns) == res.steps and res.offload_ns == sum(res.offload_step_ns)
    [mgr] = recording.made
    assert sorted(mgr.finished) == ["q0", "q1", "q2"]  # every request ends, the last one too
    assert mgr.calls["prepare_load"] == mgr.calls["complete_load"] == 1
    assert mgr.calls["complete_store"] == 2  # A and B; the third loaded its whole offer
    assert mgr.has_pending_work() is False
    # Every prompt key of A carries the end-token position of its block, as set_offload_key_position records it.
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher
    from kvcy.kv_offload import make_offload_key
    from kvcy.request import Request

    a = evicted_then_back.requests[0]
    hashes = Request("a", a.prompt_token_ids(), max_tokens=1,
                     block_hasher=get_request_block_hasher(16, get_hash_fn_by_name("sha256"))).block_hashes
    ctx = mgr.contexts["q0"]
    assert [ctx.get_offload_key_position(make_offload_key(h, 0)) for h in hashes] == [16, 32, 48, 64, 80, 96]


def test_a_small_tier_evicts_and_the_policies_differ(impl):
    trace = synthetic_trace(3, SyntheticConfig(conversations=30, max_turns=4, system_prompts=3, system_len=256,
                                               user_min=16, user_max=96, output_min=4, output_max=24, rate=40.0,
                                               think_ms=200.0))
    base = ReplayConfig(num_blocks=48, max_num_batched_tokens=256, cpu_offload_blocks=24)
    lru = replay(trace, ReplayConfig(**{**base.__dict__, "offload_policy": "lru"}), impl.name)
    arc = replay(trace, ReplayConfig(**{**base.__dict__, "offload_policy": "arc"}), impl.name)
    for res in (lru, arc):
        assert res.finished == len(trace) and res.free_blocks_at_end == base.num_blocks - 1
        assert res.cpu_evictions > 0 and res.cpu_hit_tokens > 0
        assert res.hit_tokens + res.cpu_hit_tokens <= res.query_tokens
    assert lru.step_digests != arc.step_digests  # the digest covers the CPU tier's decisions
    again = replay(trace, ReplayConfig(**{**base.__dict__, "offload_policy": "arc"}), impl.name)
    assert again.step_digests == arc.step_digests


@needs_both
def test_both_twins_make_identical_offloading_decisions(evicted_then_back):
    trace = synthetic_trace(3, SyntheticConfig(conversations=30, max_turns=4, system_prompts=3, system_len=256,
                                               user_min=16, user_max=96, output_min=4, output_max=24, rate=40.0,
                                               think_ms=200.0))
    for policy in ("lru", "arc"):
        cfg = ReplayConfig(num_blocks=48, max_num_batched_tokens=256, cpu_offload_blocks=24, offload_policy=policy)
        c = replay(trace, cfg, "cython")
        p = replay(trace, cfg, "python", expected_digests=c.step_digests)  # raises at the first difference
        assert (c.cpu_hit_tokens, c.cpu_blocks_stored, c.cpu_evictions) == (
            p.cpu_hit_tokens, p.cpu_blocks_stored, p.cpu_evictions)
        assert p.offload_impl == "python"


def test_an_offloading_decision_that_differs_is_a_divergence(monkeypatch):
    trace = synthetic_trace(3, SyntheticConfig(conversations=10, max_turns=3, system_len=128, user_max=64,
                                               output_max=16, rate=40.0, think_ms=200.0))
    cfg = ReplayConfig(num_blocks=32, max_num_batched_tokens=128, cpu_offload_blocks=16)
    ref = replay(trace, cfg, "python")
    real = offload_mod.offload_twin

    class RefusesOnce:
        """The pure twin's manager, refusing its first non-empty offer: the same GPU decisions, one CPU offer less."""

        def __init__(self, **kwargs):
            self.inner = real("python")[1].CPUOffloadingManager(**kwargs)
            self.refused = False

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def prepare_store(self, keys, req_context):
            if keys and not self.refused:
                self.refused = True
                return None
            return self.inner.prepare_store(keys, req_context)

    monkeypatch.setattr(offload_mod, "offload_twin",
                        lambda impl: ("python", types.SimpleNamespace(CPUOffloadingManager=RefusesOnce)))
    with pytest.raises(Divergence) as err:
        replay(trace, cfg, "python", expected_digests=ref.step_digests)
    lines = err.value.result.captured  # the divergence report reads the CPU tier's decisions too
    assert any("CPU tier prepare_store(" in x and "-> None" in x for x in lines)
    assert not any(x.startswith("?op") for x in lines)
    monkeypatch.undo()
    ok = replay(trace, cfg, "python", capture_step=len(ref.step_digests) - 1)
    assert any(x.startswith("CPU tier on_request_finished(") for x in ok.captured)  # the last step ends them


# Replays recorded before the replay's connector moved into the offloading twins (kvcy at a92cf4c,
# where it was Python code in kvcy.sim.offload): the decisions digest and what the CPU tier did
# (steps, GPU hit tokens, CPU hit tokens, blocks stored, blocks loaded, evictions, refused stores,
# preemptions).  Refusals, evictions, CPU hits and preemptions all occur.  (The digests were
# re-pinned when the evicted-key lists' code in the decision list went from BLAKE2b to XXH3; the
# statistics, pinned at a92cf4c, did not change.)
_PINNED = [
    (48, 24, "lru", "0db3b4fb212262d10a72d4d66ead9076", (800, 18944, 336, 1114, 23, 1090, 364, 10)),
    (48, 24, "arc", "8c7d9ccb535f3adc32fdf62f1d8e0921", (802, 18944, 160, 1161, 12, 1137, 364, 10)),
    (64, 96, "lru", "b48b82461da252ae2d9ee188680e2804", (413, 21152, 4576, 656, 287, 560, 0, 5)),
    (64, 96, "arc", "a82f2a05d412ace7dca7d457a715866a", (413, 21152, 4640, 655, 291, 559, 0, 5)),
    (40, 200, "lru", "fc9659af85025be13df8ae36a46780d2", (979, 16784, 11952, 443, 748, 243, 0, 6)),
    (40, 200, "arc", "126d537d1512bc1ae2ad5256017a0047", (979, 16784, 11040, 500, 691, 300, 0, 7)),
]


@pytest.fixture(scope="module")
def pinned_trace() -> Trace:
    return synthetic_trace(3, SyntheticConfig(conversations=40, max_turns=4, system_prompts=3, system_len=256,
                                              user_min=16, user_max=96, output_min=4, output_max=24, rate=40.0,
                                              think_ms=200.0))


@pytest.mark.parametrize("num_blocks, cpu_blocks, policy, digest, stats", _PINNED,
                         ids=[f"{n}-{c}-{p}" for n, c, p, _, _ in _PINNED])
def test_offloading_decisions_are_unchanged(impl, pinned_trace, num_blocks, cpu_blocks, policy, digest, stats):
    budget = 512 if num_blocks == 64 else 256
    cfg = ReplayConfig(num_blocks=num_blocks, max_num_batched_tokens=budget, cpu_offload_blocks=cpu_blocks,
                       offload_policy=policy)
    r = replay(pinned_trace, cfg, impl.name, timer_overhead=0)
    assert r.decisions_digest == digest
    assert (r.steps, r.hit_tokens, r.cpu_hit_tokens, r.cpu_blocks_stored, r.cpu_blocks_loaded, r.cpu_evictions,
            r.cpu_stores_refused, r.preemptions) == stats


@pytest.mark.parametrize(
    "text, blocks",
    [("8x", 800), ("0.5x", 50), ("1X", 100), ("64KiB", 16), ("1e5", 24)],
)
def test_cpu_offload_sizes(text, blocks):
    assert cpu_blocks_from_spec(text, 100, 4096) == blocks


@pytest.mark.parametrize("text, message", [("0x", "> 0"), ("nanx", "> 0"), ("2000x", "<= 1024"),
                                           ("1KiB", "holds no block"), ("lots", "not a memory size")])
def test_cpu_offload_sizes_rejected(text, message):
    with pytest.raises(ValueError, match=message):
        cpu_blocks_from_spec(text, 100, 4096)


def test_config_checks():
    with pytest.raises(ValueError, match="offload_policy"):
        ReplayConfig(num_blocks=8, cpu_offload_blocks=4, offload_policy="fifo")
    with pytest.raises(ValueError, match="cpu_offload_blocks"):
        ReplayConfig(num_blocks=8, cpu_offload_blocks=-1)
    with pytest.raises(ValueError, match="needs prefix caching"):
        ReplayConfig(num_blocks=8, cpu_offload_blocks=4, enable_caching=False)


# --------------------------------------------------------------------------- CLI
_SPEC = "synthetic:conversations=8,max_turns=3,system_len=128,user_max=64,output_max=16,rate=40,think_ms=200"


def test_cli_json_reports_the_cpu_tier(capsys):
    rc = main([_SPEC, "--num-blocks", "33", "--max-num-batched-tokens", "128", "--cpu-offload", "2x",
               "--offload-policy", "arc", "--impl", "python", "--json", "--no-progress"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    off = rep["offload"]
    assert off["cpu_blocks"] == 64 and off["policy"] == "arc" and off["times_gpu_pool"] == 2.0
    per_block = 32 * 2 * 16 * 8 * 128 * 2  # 32 layers of 8 KV heads of 128, bfloat16
    assert off["bytes_per_block"] == per_block
    assert off["bytes_stored"] == off["blocks_stored"] * per_block > 0
    assert off["bytes_loaded"] == off["blocks_loaded"] * per_block
    pc = rep["prefix_cache"]
    assert off["total_hit_rate"] == pytest.approx((pc["hit_tokens"] + off["cpu_hit_tokens"]) / pc["query_tokens"])
    assert rep["config"]["cpu_offload_blocks"] == 64 and rep["config"]["offload_policy"] == "arc"
    timing = rep["implementations"]["python"]["offload"]
    assert timing["twin"] == "python" and timing["cpu_s"] > 0
    assert timing["per_step"]["manager_and_offload_mean_us"] >= timing["per_step"]["offload_mean_us"]


def test_cli_table_and_gpu_only_report(capsys):
    assert main([_SPEC, "--num-blocks", "33", "--cpu-offload", "2MiB", "--num-layers", "1", "--impl", "python",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "CPU tier               32 blocks (512 tokens, 1.0x the GPU pool), lru" in out  # 2 MiB / 64 KiB
    assert "total hit rate" in out and "manager + offloading" in out and "CPU evictions" in out
    assert main([_SPEC, "--num-blocks", "33", "--impl", "python", "--json", "--no-progress"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["offload"] is None and "offload" not in rep["implementations"]["python"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cpu-offload", "0x"], "must be > 0"),
        (["--cpu-offload", "1KiB"], "holds no block"),
        (["--cpu-offload", "8x", "--no-prefix-caching"], "needs prefix caching"),
        (["--offload-policy", "fifo"], "invalid choice"),
        (["--offload-sweep", "0"], "each > 0"),
    ],
)
def test_cli_bad_offload_arguments(capsys, argv, message):
    assert main([_SPEC, "--num-blocks", "33", "--impl", "python", "--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err


@needs_both
def test_cli_both_checks_offloading_too(capsys):
    rc = main([_SPEC, "--num-blocks", "33", "--max-num-batched-tokens", "128", "--cpu-offload", "1x",
               "--impl", "both", "--json", "--no-progress"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["identical_decisions"] is True
    assert {d["offload"]["twin"] for d in rep["implementations"].values()} <= {"cython", "python"}


def test_cli_plot_adds_the_offloading_sweep(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "o.png"
    rc = main([_SPEC, "--num-blocks", "33", "--cpu-offload", "2x", "--impl", "python", "--json", "--no-progress",
               "--plot", str(png), "--sweep", "0.5,1", "--offload-sweep", "1,4"])
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"
    plot = json.loads(capsys.readouterr().out)["plot"]
    assert [(p["policy"], p["cpu_blocks"]) for p in plot["offload_sweep"]] == [
        ("lru", 32), ("lru", 128), ("arc", 32), ("arc", 128)]
    assert all(p["total_hit_rate"] >= p["gpu_hit_rate"] for p in plot["offload_sweep"])
    # the GPU sweep is GPU-only, the run's own pool size included
    assert [p["num_blocks"] for p in plot["sweep"]] == [16, 33]
