"""Run vLLM 0.33.0's own ``tests/v1/core`` against kvcy, unedited.

vLLM's tests import the KV-cache layer by vLLM's module names
(``from vllm.v1.core.block_pool import BlockPool``).  The redirect (:func:`redirect`)
rebinds, in vLLM's own modules, every name kvcy defines under the same module name
(the table :data:`REDIRECTS`) to kvcy's object, and makes vLLM's ``Scheduler`` build kvcy's
``KVCacheManager`` (:func:`kvcy.vllm.install`).  It runs after vLLM's scheduler, connectors
and workers have been imported, so vLLM's own code keeps the classes it bound at import;
what the tests import afterwards, and the manager the Scheduler builds, are kvcy's.  The spec
classes are the exception: vLLM's planner keeps running on the specs the tests build, so its
modules' bindings of them are rebound too.  Names vLLM has and kvcy lacks stay vLLM's.

The tests run from a staged copy (:func:`stage`): the test files of :data:`SELECTED` and the
helpers they import, under a ``tests`` package of their own with a small ``conftest.py``
(vLLM's top-level conftest imports its whole engine and GPU test tooling, which the
KV-cache layer's tests do not use), and an offline Hugging Face cache with the config files
of the two models the Scheduler tests configure (:func:`write_model_configs`).  Tests on
other models (LLaVA, Qwen2.5-VL: vLLM cannot inspect those architectures here) fail on vLLM
itself and do not count.  End-to-end tests that need a real model are left out.

As a pytest plugin (``-p kvcy.testing.vllm_core``) this module adds ``--vllm-core-target``
(``kvcy``: redirect; ``vllm``: leave vLLM alone, for the baseline) and
``--vllm-core-outcomes FILE`` (one outcome per test id, as JSON).

Command line::

    python -m kvcy.testing.vllm_core run --tests VLLM_TESTS_DIR --target kvcy --out OUT.json
    python -m kvcy.testing.vllm_core check --outcomes OUT.json --twin cython \\
        [--baseline tests/data/vllm_core_baseline.json]
    python -m kvcy.testing.vllm_core record --outcomes OUT.json --key vllm|cython|python
    python -m kvcy.testing.vllm_core gaps --outcomes OUT.json

``VLLM_TESTS_DIR`` is the ``tests`` folder of vLLM 0.33.0's sdist.  ``check`` prints, per
file, the tests that pass on vLLM and how many of those pass now, and exits 1 when a test
the baseline records as passing on that twin fails now (a ratchet: record after an
improvement, never after a loss).  ``gaps`` lists, in Markdown, each test that passes on vLLM
and failed in the run, with where and why (``run`` keeps each failure's message beside the
outcomes, in ``OUT.json.reasons``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["REDIRECTS", "SELECTED", "check", "gaps", "redirect", "run", "stage", "write_model_configs"]

#: vLLM module -> the kvcy module that re-implements it.
REDIRECTS: dict[str, str] = {
    "vllm.v1.kv_cache_interface": "kvcy.kv_cache_interface",
    "vllm.v1.core.kv_cache_utils": "kvcy.kv_cache_utils",
    "vllm.v1.core.block_pool": "kvcy.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager": "kvcy.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator": "kvcy.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager": "kvcy.kv_cache_manager",
    "vllm.v1.core.kv_cache_metrics": "kvcy.kv_cache_metrics",
    "vllm.distributed.kv_events": "kvcy.kv_events",
    "vllm.v1.hisparse.layout": "kvcy.hisparse_layout",
}

# Modules of which only these names are rebound: the events the block pool emits (vLLM's
# publishers, which the Scheduler builds, stay vLLM's).
_ONLY: dict[str, tuple[str, ...]] = {
    "vllm.distributed.kv_events": (
        "AllBlocksCleared", "BlockRemoved", "BlockStored", "EventBatch", "KVCacheEvent", "KVEventBatch",
    ),
}

# vLLM modules whose import-time bindings must stay vLLM's (its Scheduler and what the tests'
# helpers build around it); imported before anything is rebound.
_VLLM_FIRST = (
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.sched.async_scheduler",
    "vllm.v1.core.kv_cache_planning",
    "vllm.v1.core.kv_cache_config_builder",
    "vllm.v1.structured_output",
    "vllm.distributed.kv_transfer.kv_connector.factory",
    "vllm.distributed.kv_transfer.kv_connector.v1.example_connector",
)

#: The test files run, by kind: the KV-cache layer's unit tests ("kv") and the Scheduler's
#: ("scheduler").  Left out: end-to-end tests that start an engine on a real model
#: (prefix_cache/test_hybrid_prefix_cache_hit_rate.py, test_scheduler_e2e.py,
#: test_reset_prefix_cache_e2e.py) and tests of vLLM parts kvcy does not re-implement
#: (encoder cache, output processing, KV-cache planning and config builders).
SELECTED: dict[str, str] = {
    "v1/core/test_prefix_caching.py": "kv",
    "v1/core/test_single_type_kv_cache_manager.py": "kv",
    "v1/core/test_kv_cache_utils.py": "kv",
    "v1/core/test_kv_cache_metrics.py": "kv",
    "v1/core/test_contiguous_kv_packing.py": "kv",
    "v1/core/test_kv_sharing.py": "kv",
    "v1/core/test_deferred_block_free.py": "kv",
    "v1/core/test_mamba_align_chunk_split.py": "kv",
    "v1/core/test_swa_inflight_window_free.py": "kv",
    "v1/core/prefix_cache/test_partial_prefix_cache_hits.py": "kv",
    "v1/core/prefix_cache/test_partial_prefix_cache_primitives.py": "kv",
    "v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py": "kv",
    "v1/core/test_scheduler.py": "scheduler",
    "v1/core/test_async_scheduler.py": "scheduler",
    "v1/core/test_priority_preemption_bug.py": "scheduler",
    "v1/core/test_priority_scheduler_random.py": "scheduler",
    "v1/core/test_prefix_replay.py": "scheduler",
    "v1/core/test_worker_slot_overflow.py": "scheduler",
    "v1/core/test_repetition_detection.py": "scheduler",
}

# Imported by the selected files; copied beside them.
_HELPERS = (
    "__init__.py",
    "v1/__init__.py",
    "v1/core/__init__.py",
    "v1/core/prefix_cache/__init__.py",
    "v1/core/utils.py",
    "v1/kv_connector/__init__.py",
    "v1/kv_connector/unit/__init__.py",
    "v1/kv_connector/unit/utils.py",
)

_CONFTEST = '''\
"""Fixtures vLLM's KV-cache tests take from vLLM's own top-level conftest (written anew: that
conftest imports vLLM's whole engine and GPU test tooling)."""

import logging

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_test: runs on CPU")
    config.addinivalue_line("markers", "skip_global_cleanup: no GPU clean-up after the test")


@pytest.fixture
def caplog_vllm(caplog):
    """caplog that sees vLLM's records (vLLM's logger does not propagate to the root's)."""
    logger = logging.getLogger("vllm")
    propagate = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = propagate
'''

_redirected = False


def write_model_configs(hf_home: Path) -> None:
    """An offline Hugging Face cache holding only the ``config.json`` of the models the tests
    name (no weights, no tokenizer): all vLLM reads to build its configs.  Written with
    transformers' own config classes, shaped like the real models."""
    from transformers import OPTConfig, Qwen3Config

    configs = {
        "facebook/opt-125m": OPTConfig(
            vocab_size=50272, hidden_size=768, num_hidden_layers=12, ffn_dim=3072, num_attention_heads=12,
            max_position_embeddings=2048, word_embed_proj_dim=768, torch_dtype="float16",
            architectures=["OPTForCausalLM"],
        ),
        "Qwen/Qwen3-0.6B": Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
            tie_word_embeddings=True, torch_dtype="bfloat16", architectures=["Qwen3ForCausalLM"],
        ),
    }
    revision = "0" * 40
    for repo, config in configs.items():
        folder = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(revision)
        config.save_pretrained(folder / "snapshots" / revision)


_as_vllm_classes: dict[type, type] = {}


def _as_vllm(manager_class: type) -> type:
    """kvcy's ``KVCacheManager`` as vLLM's tests build it by hand: with the drop-in's settings
    (:func:`kvcy.vllm.make_kv_cache_manager`), so that an allocation that can never fit gets
    vLLM's ``None`` and hits are taken as handed over (vLLM's tests hand free, uncached blocks
    as hits), where kvcy's own default for a serving loop is a ``ValueError``."""
    if manager_class not in _as_vllm_classes:

        class KVCacheManager(manager_class):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.refuse_unservable = False
                self.refuse_stale_hits = False

        _as_vllm_classes[manager_class] = KVCacheManager
    return _as_vllm_classes[manager_class]


def _defined_in_kvcy(obj: Any) -> bool:
    return callable(obj) and (getattr(obj, "__module__", None) or "").startswith("kvcy")


def redirect() -> dict[str, list[str]]:
    """Rebind vLLM's KV-cache names to kvcy's (idempotent); returns what was rebound, by module.

    A name is rebound when vLLM's module has it and kvcy's module of the same role defines it
    (a class, or a function of kvcy's): helpers both modules merely import (``Sequence``,
    ``logger``) stay as they are.
    """
    global _redirected
    import kvcy.vllm

    for name in _VLLM_FIRST:
        importlib.import_module(name)
    kvcy.vllm.install()
    rebound = _rebind()
    _redirected = True
    return rebound


def _rebind() -> dict[str, list[str]]:
    # Also run before each test: some of vLLM's tests importlib.reload() a module
    # (kv_cache_utils), which puts vLLM's own functions and a NONE_HASH of its own back.
    rebound: dict[str, list[str]] = {}
    for vllm_name, kvcy_name in REDIRECTS.items():
        vllm_module = importlib.import_module(vllm_name)
        kvcy_module = importlib.import_module(kvcy_name)
        names = []
        for name in sorted(vars(vllm_module)):
            if name.startswith("__") or not hasattr(kvcy_module, name):
                continue
            if vllm_name in _ONLY and name not in _ONLY[vllm_name]:
                continue
            obj = getattr(kvcy_module, name)
            if not _defined_in_kvcy(obj):
                continue
            if vllm_name == "vllm.v1.core.kv_cache_manager" and name == "KVCacheManager":
                obj = _as_vllm(obj)
            setattr(vllm_module, name, obj)
            names.append(name)
        # Names kvcy's module computes on each read (kv_cache_utils.NONE_HASH, which kvcy's
        # init_none_hash sets in kvcy.hashing): read through kvcy's module __getattr__.
        if hasattr(kvcy_module, "__getattr__"):
            vllm_module.__getattr__ = kvcy_module.__getattr__  # type: ignore[method-assign]
            vars(vllm_module).pop("NONE_HASH", None)
            names.append("__getattr__")
        rebound[vllm_name] = names
    _rebind_specs_everywhere(rebound)
    return rebound


def _rebind_specs_everywhere(rebound: dict[str, list[str]]) -> None:
    """Rebind every spec class kvcy defines in every vLLM module that holds vLLM's original.

    vLLM's planner (``kv_cache_planning``), layout resolution (``resolve_kv_cache_layout``)
    and HiSparse layout stay vLLM's, and they sort the specs the tests now build (kvcy's) with
    ``isinstance``: against vLLM's classes a kvcy ``UniformTypeKVCacheSpecs`` would be read as
    one layer and a kvcy ``AttentionSpec`` would not count as attention at all.
    """
    import kvcy.kv_cache_interface as kvcy_specs

    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("vllm.") or module is None:
            continue
        for name, obj in list(vars(module).items()):
            if not (isinstance(obj, type) and obj.__module__ == "vllm.v1.kv_cache_interface"):
                continue
            ours = getattr(kvcy_specs, name, None)
            if isinstance(ours, type) and _defined_in_kvcy(ours):
                setattr(module, name, ours)
                rebound.setdefault(module_name, []).append(name)


# ---------------------------------------------------------------------------------------------
# pytest plugin
# ---------------------------------------------------------------------------------------------


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("kvcy-vllm-core")
    group.addoption("--vllm-core-target", choices=("kvcy", "vllm"), default="kvcy")
    group.addoption("--vllm-core-outcomes", default=None, help="write each test id's outcome here (JSON)")


_outcomes: dict[str, str] = {}
_reasons: dict[str, str] = {}


def pytest_configure(config: Any) -> None:
    if config.getoption("--vllm-core-target") == "kvcy":
        redirect()


def pytest_runtest_setup(item: Any) -> None:
    if _redirected:
        _rebind()


def pytest_runtest_logreport(report: Any) -> None:
    # One outcome per test: the call's, unless setup or teardown failed or skipped it.
    if report.when != "call" and report.outcome == "passed":
        return
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.outcome == "passed" else "xfailed"
    else:
        outcome = report.outcome
    if _outcomes.get(report.nodeid) != "failed":
        _outcomes[report.nodeid] = outcome
        crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
        if outcome == "failed" and crash is not None:
            message = (crash.message or "").strip().splitlines()
            _reasons[report.nodeid] = f"{Path(crash.path).name}:{crash.lineno}: {message[0] if message else ''}"[:200]


def pytest_sessionfinish(session: Any) -> None:
    path = session.config.getoption("--vllm-core-outcomes")
    if path:
        Path(path).write_text(json.dumps(_outcomes, indent=0, sort_keys=True) + "\n")
        Path(path + ".reasons").write_text(json.dumps(_reasons, indent=0, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# staging, running, checking
# ---------------------------------------------------------------------------------------------


def stage(vllm_tests: Path, dest: Path) -> list[str]:
    """Copy the selected test files and their helpers to ``dest/tests``; returns their paths."""
    root = dest / "tests"
    for rel in (*_HELPERS, *SELECTED):
        src = vllm_tests / rel
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.exists():
            shutil.copyfile(src, target)
        elif rel.endswith("__init__.py"):
            target.write_text("")
        else:
            raise FileNotFoundError(f"{src}: not in vLLM's tests (is {vllm_tests} vLLM 0.33.0's tests folder?)")
    (root / "conftest.py").write_text(_CONFTEST)
    return [f"tests/{rel}" for rel in SELECTED]


def run(vllm_tests: Path, target: str, out: Path, pytest_args: list[str] | None = None) -> int:
    """Stage and run the selected tests in a subprocess; each test's outcome goes to ``out``."""
    with tempfile.TemporaryDirectory(prefix="kvcy-vllm-core-") as tmp:
        files = stage(vllm_tests, Path(tmp))
        write_model_configs(Path(tmp) / "hf")
        env = dict(os.environ)
        env["HF_HOME"] = str(Path(tmp) / "hf")
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env["VLLM_PLUGINS"] = ""  # no general plugin (kvcy's included): the redirect decides
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kvcy.testing.vllm_core",
            f"--vllm-core-target={target}", f"--vllm-core-outcomes={out.resolve()}",
            "-W", "ignore", "--tb=line", "-o", "console_output_style=classic", *files, *(pytest_args or []),
        ]
        return subprocess.call(cmd, cwd=tmp, env=env)


def _by_file(ids: Any) -> dict[str, list[str]]:
    files: dict[str, list[str]] = defaultdict(list)
    for nodeid in ids:
        files[nodeid.split("::", 1)[0].removeprefix("tests/")].append(nodeid)
    return files


def check(baseline: dict[str, list[str]], outcomes: dict[str, str], twin: str) -> tuple[str, bool]:
    """The per-file report and whether the ratchet holds for ``twin`` ("cython" / "python")."""
    on_vllm = set(baseline["vllm"])
    recorded = set(baseline.get(twin, ()))
    passing = {t for t, o in outcomes.items() if o == "passed"}
    lines = [f"{'file':58} {'kind':9} {'vLLM':>5} {'kvcy':>5} {'fail':>5} {'rate':>7}"]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for rel, ids in sorted(_by_file(on_vllm).items()):
        kind = SELECTED.get(rel, "?")
        ok = sum(1 for t in ids if t in passing)
        totals[kind][0] += len(ids)
        totals[kind][1] += ok
        lines.append(f"{rel:58} {kind:9} {len(ids):5} {ok:5} {len(ids) - ok:5} {100 * ok / len(ids):6.1f}%")
    for kind, (n, ok) in sorted(totals.items()):
        lines.append(f"{'all ' + kind + ' tests':58} {kind:9} {n:5} {ok:5} {n - ok:5} {100 * ok / max(n, 1):6.1f}%")
    not_applicable = len(outcomes) - len(set(outcomes) & on_vllm)
    lines.append(f"not applicable (not passing on vLLM itself): {not_applicable}")
    lost = sorted(recorded - passing)
    for nodeid in lost:
        lines.append(f"REGRESSION ({twin}): {nodeid} passed before, now {outcomes.get(nodeid, 'not run')}")
    gained = sorted((passing & on_vllm) - recorded)
    if gained:
        lines.append(f"{len(gained)} test(s) pass now that the baseline does not record for {twin} (record them)")
    return "\n".join(lines), not lost


def gaps(baseline: dict[str, list[str]], outcomes: dict[str, str], reasons: dict[str, str]) -> str:
    """Each test that passes on vLLM and not here, by file, with where and why it failed."""
    lines = []
    for rel, ids in sorted(_by_file(baseline["vllm"]).items()):
        failing = [t for t in sorted(ids) if outcomes.get(t) != "passed"]
        if failing:
            lines.append(f"\n`{rel}` ({len(failing)}):\n")
            for nodeid in failing:
                reason = reasons.get(nodeid, outcomes.get(nodeid, "not run")).replace("|", "\\|")
                lines.append(f"- `{nodeid.split('::', 1)[1]}`: {reason}")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcy.testing.vllm_core", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="stage and run the selected tests")
    p_run.add_argument("--tests", type=Path, required=True, help="vLLM 0.33.0's tests folder (from its sdist)")
    p_run.add_argument("--target", choices=("kvcy", "vllm"), default="kvcy")
    p_run.add_argument("--out", type=Path, required=True)
    p_run.add_argument("pytest_args", nargs="*")
    default_baseline = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_core_baseline.json"
    p_check = sub.add_parser("check", help="report against the baseline; exit 1 on a regression")
    p_check.add_argument("--outcomes", type=Path, required=True)
    p_check.add_argument("--twin", choices=("cython", "python"), required=True)
    p_check.add_argument("--baseline", type=Path, default=default_baseline)
    p_rec = sub.add_parser("record", help="store the passing test ids of one run in the baseline")
    p_rec.add_argument("--outcomes", type=Path, required=True)
    p_rec.add_argument("--key", choices=("vllm", "cython", "python"), required=True)
    p_rec.add_argument("--baseline", type=Path, default=default_baseline)
    p_gaps = sub.add_parser("gaps", help="markdown: each test passing on vLLM that fails here, with its reason")
    p_gaps.add_argument("--outcomes", type=Path, required=True)
    p_gaps.add_argument("--baseline", type=Path, default=default_baseline)
    args = parser.parse_args(argv)
    if args.cmd == "gaps":
        print(gaps(json.loads(args.baseline.read_text()), json.loads(args.outcomes.read_text()),
                   json.loads(Path(str(args.outcomes) + ".reasons").read_text())))
        return 0
    if args.cmd == "run":
        rc = run(args.tests, args.target, args.out, args.pytest_args)
        return 0 if args.out.exists() else rc or 1
    if args.cmd == "check":
        report, ok = check(json.loads(args.baseline.read_text()), json.loads(args.outcomes.read_text()), args.twin)
        print(report)
        return 0 if ok else 1
    baseline = json.loads(args.baseline.read_text()) if args.baseline.exists() else {}
    outcomes = json.loads(args.outcomes.read_text())
    passing = {t for t, o in outcomes.items() if o == "passed"}
    if args.key != "vllm":
        passing &= set(baseline.get("vllm", ()))
    baseline[args.key] = sorted(passing)
    args.baseline.write_text(json.dumps(baseline, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(passing)} passing test ids under {args.key!r} in {args.baseline}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
