"""The oracle: every golden vector recorded from vLLM 0.33.0 replays exactly, under both twins."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from kvcy.testing import golden


def test_golden_replays_completely(impl, golden_dir):
    out = io.StringIO()
    passed, failed = golden.run([golden_dir], impl=impl.name, out=out, kinds=("hashes", "manager"))
    report = out.getvalue()
    assert failed == 0, report
    meta = json.loads((golden_dir / "meta.json").read_text())
    # Every hash case and every scenario was replayed, not skipped.
    assert passed == meta["num_hash_cases"] + meta["num_scenarios"], report


def test_golden_cli_honours_no_extensions(golden_dir, tmp_path):
    """The command-line replayer prints one line per scenario and the closing tally."""
    manager = golden_dir / "manager.jsonl"
    first = manager.open().readline()
    sample = tmp_path / "manager.jsonl"
    sample.write_text(first)
    env = dict(os.environ, KVCY_NO_EXTENSIONS="1")
    env.pop("KVCY_REQUIRE_EXTENSIONS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "kvcy.testing.golden", str(tmp_path)],
        capture_output=True, text=True, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].endswith("implementation: python")
    assert lines[-1] == "1 passed, 0 failed (manager 1/1)"


def test_golden_detects_a_wrong_expectation(tmp_path, golden_dir):
    """A tampered vector must fail: the replayer really compares."""
    scenario = json.loads((golden_dir / "manager.jsonl").open().readline())
    for op in scenario["ops"]:
        if op["op"] == "allocate_slots" and op["expect"]["new_block_ids"]:
            op["expect"]["new_block_ids"][0] = [x + 1 for x in op["expect"]["new_block_ids"][0]]
            break
    with pytest.raises(golden.GoldenMismatch):
        golden.replay_scenario(scenario)


def test_golden_offload_replays_completely(offload_impl, golden_dir):
    """Every offload.jsonl scenario (section 5 of the golden README) replays exactly."""
    out = io.StringIO()
    tally: dict[str, list[int]] = {}
    passed, failed = golden.run([golden_dir], impl=offload_impl.IMPLEMENTATION, out=out,
                                kinds=("offload",), tally=tally)
    report = out.getvalue()
    assert failed == 0, report
    meta = json.loads((golden_dir / "offload_meta.json").read_text())
    assert passed == meta["num_scenarios"], report
    assert tally == {"offload": [meta["num_scenarios"], 0]}


def _offload_scenario(golden_dir, name):
    with (golden_dir / "offload.jsonl").open() as fh:
        for line in fh:
            scenario = json.loads(line)
            if scenario["name"] == name:
                return scenario
    raise LookupError(name)


@pytest.mark.parametrize("field", ["resident", "lru_order", "event", "stats", "error", "chunk_ids"])
def test_golden_offload_detects_a_wrong_expectation(offload_impl, golden_dir, field):
    """A tampered offload vector fails, naming the op: the replayer compares every kind of result."""
    scenario = _offload_scenario(golden_dir, "adv_illegal_ops_lru")
    ops = scenario["ops"]
    if field == "resident":
        index = next(i for i, op in enumerate(ops) if op["op"] == "check")
        ops[index]["expect"]["resident"][0][2] += 1
    elif field == "lru_order":
        index = next(i for i, op in enumerate(ops) if op["op"] == "check" and len(op["expect"]["lru_order"]) > 1)
        ops[index]["expect"]["lru_order"].reverse()
    elif field == "event":
        index = next(i for i, op in enumerate(ops) if op["op"] == "take_events" and op["expect"])
        ops[index]["expect"][0]["removed"] = not ops[index]["expect"][0]["removed"]
    elif field == "stats":
        scenario = _offload_scenario(golden_dir, "adv_basic_lifecycle_lru")
        ops = scenario["ops"]
        index = next(i for i, op in enumerate(ops) if op["op"] == "get_stats")
        ops[index]["expect"]["vllm:kv_offload_cpu_cache_usage_perc"] += 0.25
    elif field == "error":
        index = next(i for i, op in enumerate(ops) if "error" in op)
        ops[index]["error"]["message"] += "!"
    else:
        index = next(i for i, op in enumerate(ops) if op["op"] == "prepare_store" and op.get("expect"))
        ops[index]["expect"]["chunk_ids"][0] += 1
    with pytest.raises(golden.GoldenMismatch, match=rf"^op {index} "):
        golden.replay_offload_scenario(scenario, offload_impl)
