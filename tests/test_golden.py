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
    passed, failed = golden.run([golden_dir], impl=impl.name, out=out)
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
    assert lines[-1] == "1 passed, 0 failed"


def test_golden_detects_a_wrong_expectation(tmp_path, golden_dir):
    """A tampered vector must fail: the replayer really compares."""
    scenario = json.loads((golden_dir / "manager.jsonl").open().readline())
    for op in scenario["ops"]:
        if op["op"] == "allocate_slots" and op["expect"]["new_block_ids"]:
            op["expect"]["new_block_ids"][0] = [x + 1 for x in op["expect"]["new_block_ids"][0]]
            break
    with pytest.raises(golden.GoldenMismatch):
        golden.replay_scenario(scenario)
