"""The one guard of the modules that check kvcy against live vLLM 0.33.0.

Every module in this folder needs vLLM, so each is skipped as a whole where vLLM 0.33.0 does not
import (a plain ``python -m pytest``, README's environment), and fails instead under
``KVCY_REQUIRE_VLLM=1`` (CI's vLLM step, where a broken install must not pass as a skip).  The
check runs before a module is imported, so the modules import vLLM at their top like any other
dependency.  vLLM reads its platform and model lookup settings at import: CPU, offline.
"""

from __future__ import annotations

import os

import pytest

from _vllm_live import require_vllm

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class _LiveModule(pytest.Module):
    """A test module of this folder: skipped (or failed) by ``require_vllm`` before its import."""

    def collect(self):
        require_vllm()
        return super().collect()


def pytest_pycollect_makemodule(module_path, parent):
    return _LiveModule.from_parent(parent, path=module_path)
