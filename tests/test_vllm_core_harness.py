"""The harness that runs vLLM 0.33.0's own tests/v1/core on kvcy (kvcy.testing.vllm_core):
its ratchet and report, and the recorded baseline CI checks against."""

from __future__ import annotations

import json
from pathlib import Path

from kvcy.testing import vllm_core

BASELINE = Path(__file__).parent / "data" / "vllm_core_baseline.json"


def test_recorded_baseline_is_consistent() -> None:
    baseline = json.loads(BASELINE.read_text())
    on_vllm = set(baseline["vllm"])
    assert on_vllm, "no test recorded as passing on vLLM"
    for twin in ("cython", "python"):
        assert set(baseline[twin]) <= on_vllm, f"{twin}: a test recorded on kvcy that fails on vLLM itself"
    files = {t.split("::", 1)[0].removeprefix("tests/") for t in on_vllm}
    assert files <= set(vllm_core.SELECTED), files - set(vllm_core.SELECTED)


def test_check_fails_on_a_regression_and_reports_per_file() -> None:
    baseline = {
        "vllm": ["tests/v1/core/test_a.py::t1", "tests/v1/core/test_a.py::t2", "tests/v1/core/test_b.py::t3"],
        "cython": ["tests/v1/core/test_a.py::t1"],
    }
    ok_run = {"tests/v1/core/test_a.py::t1": "passed", "tests/v1/core/test_a.py::t2": "failed",
              "tests/v1/core/test_b.py::t3": "passed", "tests/v1/core/test_b.py::t4": "failed"}
    report, ok = vllm_core.check(baseline, ok_run, "cython")
    assert ok
    assert "v1/core/test_a.py" in report and "50.0%" in report
    assert "not applicable (not passing on vLLM itself): 1" in report
    assert "1 test(s) pass now" in report  # t3 gained

    lost_run = dict(ok_run, **{"tests/v1/core/test_a.py::t1": "failed"})
    report, ok = vllm_core.check(baseline, lost_run, "cython")
    assert not ok
    assert "REGRESSION (cython): tests/v1/core/test_a.py::t1" in report


def test_stage_copies_the_selected_files_and_a_conftest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in vllm_core.SELECTED:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("def test_x():\n    pass\n")
    for rel in ("v1/core/utils.py", "v1/kv_connector/unit/utils.py"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("")
    files = vllm_core.stage(src, tmp_path / "dest")
    assert len(files) == len(vllm_core.SELECTED)
    assert all((tmp_path / "dest" / f).is_file() for f in files)
    assert "caplog_vllm" in (tmp_path / "dest" / "tests" / "conftest.py").read_text()
    assert (tmp_path / "dest" / "tests" / "v1" / "core" / "__init__.py").is_file()


def test_gaps_lists_each_test_passing_on_vllm_that_fails_with_its_reason() -> None:
    baseline = {"vllm": ["tests/v1/core/test_a.py::t1", "tests/v1/core/test_a.py::t2"]}
    outcomes = {"tests/v1/core/test_a.py::t1": "passed", "tests/v1/core/test_a.py::t2": "failed",
                "tests/v1/core/test_a.py::t9": "failed"}
    reasons = {"tests/v1/core/test_a.py::t2": "x.py:3: NotImplementedError: a|b"}
    text = vllm_core.gaps(baseline, outcomes, reasons)
    assert "`v1/core/test_a.py` (1):" in text
    assert "- `t2`: x.py:3: NotImplementedError: a\\|b" in text
    assert "t1" not in text and "t9" not in text
