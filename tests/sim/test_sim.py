"""The scheduler loop and ``kvcy replay``: conservation, hit rates, preemption, twin agreement, CLI."""

from __future__ import annotations

import json

import pytest

from kvcy import _fast
from kvcy.sim.cli import main
from kvcy.sim.scheduler import Divergence, ReplayConfig, replay, timer_overhead_ns
from kvcy.sim.synthetic import SyntheticConfig, synthetic_trace
from kvcy.sim.traces import Trace, TraceRequest, fresh_tokens, hit_rate_upper_bound, read_mooncake

BOTH = "cython" in _fast.available() and not _fast.NO_EXTENSIONS
needs_both = pytest.mark.skipif(not BOTH, reason="compiled twins not built (or KVCY_NO_EXTENSIONS=1)")

SMALL = SyntheticConfig(
    conversations=12, max_turns=3, system_prompts=2, system_len=256,
    user_min=16, user_max=128, output_min=4, output_max=48, rate=20.0, think_ms=300.0,
)


@pytest.fixture(scope="module")
def small_trace() -> Trace:
    return synthetic_trace(5, SMALL)


def _check_conservation(trace: Trace, res, cfg: ReplayConfig) -> None:
    assert res.rejected == 0
    assert res.finished == res.requests == len(trace)
    assert res.prompt_tokens == trace.num_prompt_tokens
    assert res.output_tokens == trace.num_output_tokens
    assert res.free_blocks_at_end == cfg.num_blocks - 1  # every block came back
    assert res.steps == len(res.step_ns) == len(res.step_digests)
    assert 0.0 < res.peak_usage <= 1.0 and 0.0 < res.mean_usage <= res.peak_usage


# --------------------------------------------------------------------------- conservation
def test_conservation(impl, small_trace):
    cfg = ReplayConfig(num_blocks=1024)
    res = replay(small_trace, cfg, impl.name)
    _check_conservation(small_trace, res, cfg)
    assert res.preemptions == 0
    assert res.hit_tokens > 0  # shared system prompts and follow-up turns hit


@pytest.mark.parametrize("reserve_full_isl", [True, False], ids=["full-isl", "first-chunk"])
def test_conservation_under_preemption(impl, small_trace, reserve_full_isl):
    cfg = ReplayConfig(num_blocks=72, max_num_batched_tokens=256, reserve_full_isl=reserve_full_isl)
    res = replay(small_trace, cfg, impl.name)
    _check_conservation(small_trace, res, cfg)
    assert res.preemptions > 0  # the pool is small: requests really are preempted ...
    assert res.recompute_query_tokens > 0  # ... and re-admitted
    assert res.peak_usage == 1.0 or res.peak_usage > 0.9
    assert res.evictions is None or res.evictions > 0


def test_replay_is_deterministic(small_trace):
    cfg = ReplayConfig(num_blocks=96, max_num_batched_tokens=200)
    a = replay(small_trace, cfg, "python")
    b = replay(small_trace, cfg, "python")
    assert a.step_digests == b.step_digests and a.decisions_digest == b.decisions_digest


def test_a_step_that_schedules_nothing_stops_the_loop():
    """A manager that admits nothing would leave the loop spinning on one waiting request."""

    class NoBlocks:
        def get_block_ids(self):
            return ([],)

    class RefusingManager:
        def __init__(self):
            self.calls: list[str] = []

        def free(self, request):
            self.calls.append("free")

        def get_computed_blocks(self, request):
            self.calls.append("get_computed_blocks")
            return NoBlocks(), 0, 0

        def allocate_slots(self, request, num_new_tokens, **kwargs):
            self.calls.append("allocate_slots")
            return None

    trace = Trace("t", [TraceRequest("a", 0.0, 20, 2, prompt=fresh_tokens(b"a", 20), index=0)])
    mgr = RefusingManager()
    with pytest.raises(RuntimeError, match=r"the scheduler made no progress at step 0 \(0 running, 1 waiting\)"):
        replay(trace, ReplayConfig(num_blocks=8), "python", manager=mgr, timer_overhead=0)
    assert mgr.calls == ["get_computed_blocks", "allocate_slots"]  # one admission tried, then the loop stopped


def test_too_long_requests_are_rejected():
    reqs = [
        TraceRequest("a", 0.0, 100, 5, prompt=fresh_tokens(b"a", 100), index=0),
        TraceRequest("b", 1.0, 400, 5, prompt=fresh_tokens(b"b", 400), index=1),
    ]
    cfg = ReplayConfig(num_blocks=17, block_size=16)  # 256 tokens
    res = replay(Trace("t", reqs), cfg, "python")
    assert (res.requests, res.finished, res.rejected) == (1, 1, 1)
    assert res.max_model_len == 256


# --------------------------------------------------------------------------- hit rate
def _far_apart(prompts_outputs):
    """Requests one simulated hour apart, so each finishes before the next arrives."""
    return Trace(
        "hand",
        [
            TraceRequest(f"q{i}", i * 3.6e6, len(p), len(o), prompt=p, output=o, index=i)
            for i, (p, o) in enumerate(prompts_outputs)
        ],
    )


def test_hit_rate_matches_hand_computed(impl):
    s, x, y, z = (fresh_tokens(k, n) for k, n in ((b"s", 64), (b"x", 20), (b"y", 30), (b"z", 40)))
    out_a = fresh_tokens(b"oa", 4)
    trace = _far_apart([
        (s + x, out_a),                 # A: 84 tokens, nothing cached
        (s + y, fresh_tokens(b"ob", 3)),  # B: hits S = 4 blocks = 64 tokens
        (s + x, fresh_tokens(b"oc", 2)),  # C: A's prompt again: 5 full blocks = 80 (never the last token)
        (s + x + out_a + z, fresh_tokens(b"od", 2)),  # D: A's history: A computed 87 tokens -> 5 blocks = 80
    ])
    cfg = ReplayConfig(num_blocks=256, block_size=16)
    res = replay(trace, cfg, impl.name)
    assert (res.hit_tokens, res.query_tokens) == (0 + 64 + 80 + 80, 84 + 94 + 84 + 128)
    assert hit_rate_upper_bound(trace, 16) is None  # no hash ids
    assert res.hit_rate == pytest.approx(224 / 390)
    stats = res.manager_prefix_cache_stats
    assert stats is None or (stats["requests"], stats["queries"], stats["hits"]) == (4, 390, 224)


def test_mooncake_hit_rate_matches_hand_computed(tmp_path, impl):
    rows = [
        (0, 1000, 3, [0, 1]),  # nothing cached
        (10**6, 600, 2, [0, 2]),  # shares block 0: 512 tokens
        (2 * 10**6, 1000, 2, [0, 1]),  # same prompt as the first: (1000 - 1) // 16 * 16 = 992
        (3 * 10**6, 300, 1, [7]),  # nothing
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(
        json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h}) + "\n"
        for t, n, o, h in rows
    ))
    trace = read_mooncake(path)
    res = replay(trace, ReplayConfig(num_blocks=512, block_size=16), impl.name)
    assert res.hit_tokens == 512 + 992
    assert res.query_tokens == 1000 + 600 + 1000 + 300
    assert hit_rate_upper_bound(trace, 16) == res.hit_rate  # far apart, big pool: the bound is reached
    res8 = replay(trace, ReplayConfig(num_blocks=1024, block_size=8), impl.name)
    assert res8.hit_tokens == 512 + 992  # 999 // 8 * 8 = 992 too
    res64 = replay(trace, ReplayConfig(num_blocks=64, block_size=64), impl.name)
    assert res64.hit_tokens == 512 + 960


# --------------------------------------------------------------------------- agreement
@needs_both
def test_cython_and_python_make_identical_decisions(small_trace):
    for cfg in (ReplayConfig(num_blocks=1024), ReplayConfig(num_blocks=72, max_num_batched_tokens=256)):
        c = replay(small_trace, cfg, "cython")
        p = replay(small_trace, cfg, "python", expected_digests=c.step_digests)  # raises on any difference
        assert c.step_digests == p.step_digests
        assert (c.hit_tokens, c.preemptions, c.evictions) == (p.hit_tokens, p.preemptions, p.evictions)


def test_a_different_decision_is_reported(small_trace):
    cfg = ReplayConfig(num_blocks=96, max_num_batched_tokens=200)
    ref = replay(small_trace, cfg, "python")
    tampered = list(ref.step_digests)
    tampered[7] = b"\0" * 8
    with pytest.raises(Divergence) as e:
        replay(small_trace, cfg, "python", expected_digests=tampered)
    assert e.value.step == 7
    lines = e.value.result.captured
    assert lines and any("allocate_slots(" in x for x in lines)
    short = replay(small_trace, cfg, "python", capture_step=7, stop_after_step=7)
    assert short.captured == lines and short.steps == 8
    with pytest.raises(Divergence):  # a run that takes a different number of steps differs too
        replay(small_trace, cfg, "python", expected_digests=ref.step_digests[:-1])


# --------------------------------------------------------------------------- timing
def test_timer_overhead_is_measured():
    t = timer_overhead_ns(2001)
    assert isinstance(t, int) and 0 < t < 100_000  # an empty interval costs something, not 0.1 ms
    with pytest.raises(ValueError, match="samples"):
        timer_overhead_ns(0)


def test_timer_cost_is_removed_per_timed_call(small_trace):
    cfg = ReplayConfig(num_blocks=256)
    raw = replay(small_trace, cfg, "python", timer_overhead=0)
    assert raw.timer_overhead_ns == 0
    assert raw.manager_ns == raw.manager_ns_raw == sum(raw.step_ns) > 0
    # An overhead larger than any call's time leaves every step at 0 (never negative) ...
    big = replay(small_trace, cfg, "python", timer_overhead=10**9)
    assert big.manager_ns == 0 and set(big.step_ns) == {0} and big.manager_ns_raw > 0
    # ... and a plausible one removes at most calls x overhead, step by step.
    corr = replay(small_trace, cfg, "python", timer_overhead=50)
    assert corr.timer_overhead_ns == 50 and corr.manager_calls == raw.manager_calls
    assert corr.manager_ns == sum(corr.step_ns) < corr.manager_ns_raw
    assert corr.manager_ns >= corr.manager_ns_raw - 50 * corr.manager_calls
    assert corr.step_digests == raw.step_digests  # timing never changes a decision
    with pytest.raises(ValueError, match="timer_overhead"):
        replay(small_trace, cfg, "python", timer_overhead=-1)


# --------------------------------------------------------------------------- CLI
def test_cli_json(capsys):
    rc = main(["synthetic:conversations=6,system_len=64,output_max=16,user_max=64", "--seed", "2",
               "--num-blocks", "128", "--impl", "python", "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["requests"]["finished"] == rep["requests"]["admitted"] == rep["trace"]["requests_replayed"]
    assert rep["config"]["num_blocks"] == 128 and rep["free_blocks_at_end"] == 127
    assert 0.0 <= rep["prefix_cache"]["hit_rate"] <= 1.0
    assert set(rep["implementations"]) == {"python"} and rep["speedup"] is None
    py = rep["implementations"]["python"]
    per_step = py["per_step"]
    assert per_step["p50_us"] <= per_step["p99_us"] <= per_step["max_us"]
    assert py["timer_overhead_ns_per_call"] > 0
    assert 0 < py["manager_cpu_s"] < py["manager_cpu_s_timer_included"]


def test_cli_table_on_the_bundled_trace(capsys):
    assert main(["--limit", "3", "--impl", "python", "--no-progress", "--kv-memory", "2GiB",
                 "--no-reserve-full-isl"]) == 0
    out = capsys.readouterr().out
    assert "bundled" in out and "first 3 of 2,000" in out
    assert "prefix-cache hit rate" in out and "per step, p99" in out and "timer cost removed" in out
    assert "pool 1,024 blocks" in out  # 2 GiB / (32 layers * 2 * 16 * 8 * 128 * 2 bytes)


@needs_both
def test_cli_both(capsys, tmp_path):
    png = tmp_path / "r.png"
    rc = main(["synthetic:conversations=8,system_len=128,output_max=24,user_max=64", "--num-blocks", "64",
               "--max-num-batched-tokens", "128", "--impl", "both", "--json", "--plot", str(png), "--sweep", "0.5,2"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["identical_decisions"] is True and rep["speedup"] > 0 and rep["speedup_timer_included"] > 0
    cy, py = rep["implementations"]["cython"], rep["implementations"]["python"]
    assert cy["timer_overhead_ns_per_call"] == py["timer_overhead_ns_per_call"] > 0  # calibrated once
    assert set(rep["implementations"]) == {"cython", "python"}
    assert png.stat().st_size > 10_000
    assert [p["num_blocks"] for p in rep["plot"]["sweep"]] == [32, 64, 128]


def test_cli_plot_python(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    rc = main(["synthetic:conversations=4,system_len=64,output_min=2,output_max=8,user_max=32", "--num-blocks", "64",
               "--impl", "python", "--plot", str(png), "--sweep", "0.5"])
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"
    assert "plot written to" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["/no/such/trace.jsonl"], "trace file not found"),
        (["--num-blocks", "0"], "expected an integer from 2"),
        (["--num-blocks", "1", "--limit", "1"], "(block 0 is the null block)"),
        (["--kv-memory", "lots"], "not a memory size"),
        (["--kv-memory", "1MiB"], "holds 0 block"),
        (["--num-blocks", "8", "--kv-memory", "1GiB"], "not allowed with"),
        (["--gpu-memory", "24GiB"], "--kv-memory SIZE"),
        (["--hash", "md5"], "invalid choice"),
        (["--impl", "rust"], "invalid choice"),
        (["synthetic:nope=1"], "bad synthetic option"),
        (["--plot", "x.svg"], "give a .png"),
        (["--plot", "/no/such/dir/x.png"], "does not exist"),
        (["--dtype", "float7", "--kv-memory", "1GiB"], "dtype"),
        (["--sweep", "0,1"], "each > 0"),
        (["--sweep", "nan"], "each > 0"),
        (["--step-ms", "inf"], "expected a number in [0, 3.6e+06]"),
        (["--token-us", "nan"], "expected a number in [0, 1e+06]"),
    ],
)
def test_cli_bad_input(capsys, argv, message):
    rc = main(argv + ["--impl", "python", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_cli_bad_trace_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    assert main([str(bad), "--impl", "python"]) == 2
    assert "bad.jsonl line 1" in capsys.readouterr().err


def test_cli_help(capsys):
    assert main(["--help"]) == 0
    assert "--num-blocks" in capsys.readouterr().out


def test_cli_fails_loudly_when_decisions_differ(monkeypatch, capsys):
    """--impl both: a different decision in the second run is a loud failure naming the step."""
    import kvcy.sim.cli as cli

    real_replay = cli.replay

    def tampering_replay(trace, config, impl, **kw):
        expected = kw.get("expected_digests")
        if expected is not None:
            kw["expected_digests"] = expected[:3] + [b"\1" * 8] + expected[4:]
        return real_replay(trace, config, "python", **kw)

    monkeypatch.setattr(cli, "_impls", lambda choice: ["python", "python"])
    monkeypatch.setattr(cli, "replay", tampering_replay)
    rc = main(["synthetic:conversations=5,system_len=64,output_min=2,output_max=8,user_max=32",
               "--num-blocks", "64", "--impl", "both", "--no-progress"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "DECISIONS DIFFER" in err and "step 3" in err
    assert "allocate_slots(" in err or "get_computed_blocks(" in err
