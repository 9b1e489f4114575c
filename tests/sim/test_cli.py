"""The ``kvcy`` command: shared argument types, sub-parsers, inputs that must not hang, one progress bar."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvcy
import kvcy.plan
import kvcy.sim.traces
import kvcy.sim.cli
from kvcy.cli import float_arg, int_arg, main, parse_size

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def _strict_json(text: str):
    """``json.loads`` that refuses NaN and Infinity, which are not JSON."""

    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _kvcy(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m kvcy ...`` in a child process that may not outlive ``timeout`` (it raises TimeoutExpired)."""
    return subprocess.run(
        [sys.executable, "-m", "kvcy", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )


# --------------------------------------------------------------------------- sizes and numbers
def test_one_size_parser_for_every_command():
    assert kvcy.plan.parse_size is kvcy.sim.cli.parse_size is parse_size


@pytest.mark.parametrize(
    "text, expected",
    [
        ("32GiB", 32 * GiB), ("32G", 32 * GiB), ("32Gi", 32 * GiB), ("2gib", 2 * GiB), ("40GB", 40 * 10**9),
        ("1.5MiB", 3 * 2**19), ("1.5TiB", 3 * 2**39), ("64 KiB", 65536), ("4096", 4096), ("4096B", 4096),
        ("5e9", 5 * 10**9), ("2.5e3", 2500), ("1e-3GiB", GiB // 1000), ("1", 1),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "not a memory size"), ("GiB", "not a memory size"), ("-1G", "not a memory size"),
        ("1XB", "not a memory size"), ("nan", "not a memory size"), ("inf", "not a memory size"),
        ("1e400", "too large"), ("2000TiB", "larger than 1 PiB"),
        ("0", "at least 1 byte"), ("0.5", "at least 1 byte"), ("0GiB", "at least 1 byte"),
    ],
)
def test_parse_size_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_size(text)


def test_the_same_size_is_refused_the_same_way_by_both_commands(capsys):
    """Once, plan refused 5e9 and took 0 while replay did the opposite."""
    assert kvcy.sim.cli.main(["--kv-memory", "0", "--limit", "1"]) == 2
    replay_err = capsys.readouterr().err
    assert kvcy.plan.main(["--preset", "llama-3-8b", "--kv-memory", "0"]) == 2
    plan_err = capsys.readouterr().err
    assert "memory size must be at least 1 byte, got '0'" in replay_err
    assert "memory size must be at least 1 byte, got '0'" in plan_err
    assert kvcy.plan.main(["--preset", "llama-3-8b", "--kv-memory", "5e9", "--json"]) == 0
    assert _strict_json(capsys.readouterr().out)["available_memory_bytes"] == 5 * 10**9


def test_int_and_float_args():
    assert int_arg(2)("7") == 7
    for bad, message in (("1", "an integer >= 2"), ("x", "an integer >= 2"), ("2.5", "an integer >= 2")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            int_arg(2)(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="a positive integer, got '0'"):
        int_arg(1)("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"from 1 to 10 \(why\), got '11'"):
        int_arg(1, 10, " (why)")("11")
    half_open = float_arg(0.0, 1.0, include_minimum=False)
    assert half_open("1") == 1.0
    for bad in ("0", "nan", "inf", "-inf", "1.01", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"a number in \(0, 1\]"):
            half_open(bad)


# --------------------------------------------------------------------------- the command and its sub-parsers
def test_top_level_help_is_plain_text(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":mod:" not in out  # no RST markup
    assert "replay" in out and "plan" in out and "COMMAND --help" in out


def test_no_command_and_unknown_command_exit_2(capsys):
    assert main([]) == 2
    assert "required: COMMAND" in capsys.readouterr().err
    assert main(["bogus"]) == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_sub_commands_dispatch_through_argparse(capsys, monkeypatch):
    """Each sub-parser names its module's ``run`` with ``set_defaults(func=...)``; main only calls it."""
    from kvcy.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {name: p.get_default("func") for name, p in sub.choices.items()} == {
        "replay": kvcy.sim.cli.run, "plan": kvcy.plan.run,
    }
    args = parser.parse_args(["plan", "--list-presets"])
    assert args.command == "plan" and args.func is kvcy.plan.run

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(kvcy.plan, "run", interrupted)
    assert main(["plan", "--list-presets"]) == 130
    assert capsys.readouterr().err == "kvcy plan: interrupted\n"


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvcy {kvcy.__version__} ({kvcy.IMPLEMENTATION})"


def test_sub_command_help_comes_from_the_sub_parser(capsys):
    assert main(["replay", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kvcy replay") and "--kv-memory SIZE" in out and "--gpu-memory" not in out
    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kvcy plan") and "--kv-memory SIZE" in out and "--model-memory" in out
    # each module's main(argv) is the same parser
    assert kvcy.sim.cli.main(["--help"]) == 0 and capsys.readouterr().out.startswith("usage: kvcy replay")


def test_replay_gpu_memory_is_refused_with_the_new_name(capsys):
    """--gpu-memory meant KV-cache memory in replay and total GPU memory in plan."""
    assert main(["replay", "--gpu-memory", "24GiB"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-memory is not an option of kvcy replay" in err and "--kv-memory SIZE" in err
    # --kv-memory (alias --memory) is KV-cache memory in both commands
    assert main(["replay", "--limit", "1", "--impl", "python", "--kv-memory", "2GiB", "--json"]) == 0
    a = _strict_json(capsys.readouterr().out)
    assert main(["replay", "--limit", "1", "--impl", "python", "--memory", "2GiB", "--json"]) == 0
    b = _strict_json(capsys.readouterr().out)
    assert a["config"]["num_blocks"] == b["config"]["num_blocks"] == 1024
    assert main(["plan", "--preset", "llama-3-8b", "--kv-memory", "2GiB", "--json"]) == 0
    plan = _strict_json(capsys.readouterr().out)
    assert plan["available_memory_bytes"] == 2 * GiB and plan["num_blocks"] == 1024  # same shape, same blocks


# --------------------------------------------------------------------------- inputs that once spun forever
def _one_line_trace(tmp_path: Path, timestamp: str) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1]}\n'
        f'{{"timestamp": {timestamp}, "input_length": 20, "output_length": 2, "hash_ids": [1]}}\n'
    )
    return path


@pytest.mark.parametrize(
    "timestamp, message",
    [
        # NaN and Infinity are not JSON (Python's json reads them; msgspec does not)
        ("NaN", "t.jsonl line 2: JSON is malformed: invalid character (byte 14)"),
        ("Infinity", "t.jsonl line 2: JSON is malformed: invalid character (byte 14)"),
        ("-Infinity", "t.jsonl line 2: JSON is malformed: invalid character (byte 15)"),
        ("1e300", "t.jsonl line 2: Expected `float` <= 10000000000000.0 - at `$.timestamp`"),
        ("-1", "t.jsonl line 2: Expected `float` >= 0.0 - at `$.timestamp`"),
    ],
)
def test_non_finite_and_absurd_timestamps_are_refused_with_the_line(tmp_path, timestamp, message):
    """A NaN arrival never compared as arrived: the replay spun at 100 % CPU forever."""
    res = _kvcy("replay", str(_one_line_trace(tmp_path, timestamp)), "--impl", "python", "--json")
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize("spec", ["synthetic:rate=nan", "synthetic:think_ms=nan", "synthetic:rate=1e-300"])
def test_synthetic_times_that_never_arrive_are_refused(spec):
    res = _kvcy("replay", spec, "--impl", "python", "--json")
    assert res.returncode == 2, res.stderr
    assert "kvcy replay: error: synthetic" in res.stderr and "Traceback" not in res.stderr


_TWO_REQUESTS = textwrap.dedent(
    """
    import sys
    from kvcy.sim.scheduler import ReplayConfig, replay
    from kvcy.sim.traces import Trace, TraceRequest, fresh_tokens

    trace = Trace("t", [TraceRequest(f"q{i}", float(t), 20, 2, prompt=fresh_tokens(b"%d" % i, 20), index=i)
                        for i, t in enumerate(sys.argv[1:])])
    try:
        print(replay(trace, ReplayConfig(num_blocks=64), "python").finished)
    except ValueError as exc:
        print(exc)
    """
)


@pytest.mark.parametrize(
    "times, expected",
    [
        (["0", "nan"], "request 'q1': arrival_ms must be a number from 0 to 1e+13, got nan"),
        (["0", "inf"], "request 'q1': arrival_ms must be a number from 0 to 1e+13, got inf"),
        (["0", "1e300"], "request 'q1': arrival_ms must be a number from 0 to 1e+13, got 1e+300"),
        (["-1", "0"], "request 'q0': arrival_ms must be a number from 0 to 1e+13, got -1.0"),
        (["5", "1"],
         "request 'q1' arrives at 1.0 ms, before the request ahead of it (5.0 ms): a trace is in arrival order"),
        (["0", "1e12"], "2"),  # far, but a clock can get there
    ],
)
def test_replay_refuses_arrival_times_it_cannot_follow(times, expected):
    res = subprocess.run([sys.executable, "-c", _TWO_REQUESTS, *times], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.stdout.strip() == expected, res.stderr


_STALLING_MANAGER = textwrap.dedent(
    """
    import sys
    from kvcy.sim.scheduler import ReplayConfig, build_manager, replay
    from kvcy.sim.traces import Trace, TraceRequest, fresh_tokens

    trace = Trace("t", [TraceRequest("a", 0.0, 40, 8, prompt=fresh_tokens(b"a", 40), index=0)])
    cfg = ReplayConfig(num_blocks=64)
    impl = sys.argv[1]


    class Rewinding:
        # A broken manager: each allocation for a running request takes its
        # tokens back, so the scheduler steps forever with nothing finishing.
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            out = self.inner.allocate_slots(request, num_new_tokens, *args, **kwargs)
            if not kwargs:
                request.num_computed_tokens -= num_new_tokens
            return out


    try:
        replay(trace, cfg, impl, manager=Rewinding(build_manager(impl, cfg, cfg.resolve_max_model_len(trace))))
    except RuntimeError as exc:
        print(exc)
        sys.exit(3)
    """
)


def test_a_loop_that_steps_without_progress_is_stopped(impl):
    """The stall guard: more steps without a finished request than max_model_len is an error, not a hang."""
    res = subprocess.run([sys.executable, "-c", _STALLING_MANAGER, impl.name], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert "the scheduler made no progress: no request finished in 51 steps" in res.stdout  # max_model_len 48 + 3


# --------------------------------------------------------------------------- one progress bar
class _RecordingBar:
    made: list[_RecordingBar] = []

    def __init__(self, total=None, **kwargs):
        self.total, self.n, self.descriptions, self.closed = total, 0, [], False
        _RecordingBar.made.append(self)

    def update(self, n=1):
        self.n += n

    def set_description(self, text):
        self.descriptions.append(text)

    def close(self):
        self.closed = True


def test_one_progress_bar_over_the_whole_sweep(monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    import tqdm

    monkeypatch.setattr(tqdm, "tqdm", _RecordingBar)
    monkeypatch.setattr(_RecordingBar, "made", [])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    spec = "synthetic:conversations=4,system_len=64,output_min=2,output_max=8,user_max=32"
    rc = main(["replay", spec, "--num-blocks", "64", "--impl", "python", "--plot", str(tmp_path / "p.png"),
               "--sweep", "0.5,1,2", "--json"])
    assert rc == 0
    requests = _strict_json(capsys.readouterr().out)["trace"]["requests_replayed"]
    [bar] = _RecordingBar.made  # one bar, not one per run
    assert bar.total == bar.n == 3 * requests and bar.closed  # 64 blocks (once: 1 x 64 is the run itself), 32, 128
    assert bar.descriptions == [
        "replay 1/3 [python, 64 blocks]", "sweep 2/3 [python, 32 blocks]", "sweep 3/3 [python, 128 blocks]",
    ]


# --------------------------------------------------------------------------- hostile inputs: one line, exit 2
def _gz_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    import gzip

    rows = b'{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1]}\n' * 200
    whole = gzip.compress(rows)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "fake.jsonl.gz").write_bytes(b"garbage\n")
    with gzip.open(tmp_path / "bomb.jsonl.gz", "wb") as f:  # one line just over the cap
        f.write(b'{"timestamp": 0' + b" " * kvcy.sim.traces.MAX_LINE_BYTES + b"}\n")
    (tmp_path / "folder.jsonl").mkdir()
    return {
        "cut": (tmp_path / "cut.jsonl.gz", "cut.jsonl.gz: not a whole gzip file (Compressed file ended"),
        "fake": (tmp_path / "fake.jsonl.gz", "fake.jsonl.gz: not a whole gzip file (Not a gzipped file (b'ga'))"),
        "bomb": (tmp_path / "bomb.jsonl.gz", "bomb.jsonl.gz line 1: longer than 1,048,576 bytes: not a trace row"),
        "folder": (tmp_path / "folder.jsonl", "folder.jsonl' is not a regular file"),
    }


@pytest.mark.parametrize("case", ["cut", "fake", "bomb", "folder"])
def test_broken_and_oversized_trace_files_are_one_line_errors(tmp_path, capsys, case):
    """A truncated or fake .jsonl.gz, a line past MAX_LINE_BYTES (a gzip bomb's one 6 GiB line
    was read whole) and a folder: a one-line error naming the file, exit 2, no traceback."""
    import kvcy.sim.traces

    path, message = _gz_cases(tmp_path)[case]
    assert main(["replay", str(path), "--impl", "python", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcy replay: error: ") and message in err and err.count("\n") == 1, err
    assert "trace file not found" not in err
    assert kvcy.sim.traces.MAX_LINE_BYTES == 1 << 20


def test_plan_reads_only_a_small_regular_model_file(tmp_path):
    """``--model /dev/zero`` read until MemoryError; a folder or a huge file is refused at once.
    (Run with an address-space limit, so that a regression fails fast instead of eating memory.)"""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    big = tmp_path / "big.json"
    big.write_bytes(b" " * (kvcy.plan.MAX_MODEL_FILE_BYTES + 1))
    cases = {"/dev/zero": "model description '/dev/zero' is not a regular file",
             str(tmp_path): f"model description {str(tmp_path)!r} is not a regular file",
             str(big): f"model description {str(big)!r} is larger than 1,048,576 bytes"}
    for model, message in cases.items():
        res = subprocess.run([sys.executable, "-m", "kvcy", "plan", "--model", model, "--kv-memory", "1GiB"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, preexec_fn=limited)
        assert res.returncode == 2 and f"kvcy plan: error: {message}" in res.stderr, res.stderr[-2000:]
        assert "Traceback" not in res.stderr


def test_plan_budget_below_the_null_block_says_what_it_takes(capsys):
    """A budget smaller than the null block was reported as "-2096128 bytes" of memory."""
    assert main(["plan", "--preset", "llama-3-8b", "--kv-memory", "1KiB"]) == 2
    err = capsys.readouterr().err
    assert ("a KV-cache budget of 1.00 KiB is too small for llama-3-8b: the null block alone "
            "(one block of every layer) takes 2.00 MiB") in err
    assert "-2096128" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "int3"], "argument --dtype: unknown dtype 'int3'"),  # refused without --kv-memory too
        (["--seed", "-1"], "argument --seed: expected an integer from 0 to 18,446,744,073,709,551,615, got '-1'"),
        (["--cpu-offload", "-3x"], "--cpu-offload '-3x': a multiple of the GPU pool must be > 0 and <= 1024"),
        (["--cpu-offload", "-2GiB"], "not a memory size: '-2GiB'"),
        (["synthetic:conversations=1e12"], "synthetic conversations must be a number from 0 to 1e+06, "
                                           "got 1000000000000"),
        (["synthetic:conversations=2.5"], "synthetic option conversations needs a whole number, got '2.5'"),
    ],
)
def test_replay_refuses_bad_options_when_given(capsys, argv, message):
    assert main(["replay", *argv, "--limit", "1", "--impl", "python", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "expected one argument" not in err, err


def test_synthetic_counts_take_whole_numbers_written_as_floats():
    from kvcy.sim.synthetic import parse_synthetic_spec

    assert parse_synthetic_spec("synthetic:conversations=1e3,max_turns=2.0").conversations == 1000


def test_no_extensions_rules_out_impl_cython():
    """KVCY_NO_EXTENSIONS=1 forces the pure twins everywhere: ``--impl cython`` (or both) ran
    the compiled twin anyway."""
    import os

    env = {**os.environ, "KVCY_NO_EXTENSIONS": "1"}
    env.pop("KVCY_REQUIRE_EXTENSIONS", None)
    for impl in ("cython", "both"):
        res = subprocess.run([sys.executable, "-m", "kvcy", "replay", "--impl", impl, "--limit", "1", "--json"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert res.returncode == 2 and res.stdout == "", res.stderr
        assert f"KVCY_NO_EXTENSIONS=1 rules out the compiled (cython) twins: --impl {impl}" in res.stderr


def test_missing_matplotlib_hint_suits_a_source_checkout(monkeypatch, tmp_path, capsys):
    """``pip install 'kvcy[plot]'`` would fetch kvcy from the index over an editable checkout:
    the hint names matplotlib itself."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["replay", "--limit", "1", "--impl", "python", "--plot", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib, which is not installed: pip install matplotlib" in err
    assert "kvcy[plot]" not in err
