"""What the test modules with live checks against vLLM 0.33.0 share: whether it imports here,
the ``live`` marker that skips a test where it does not, and CI's ``KVCY_REQUIRE_VLLM=1``
(the vLLM step: a broken install fails at import, never skips).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest


def vllm_importable() -> bool:
    """Whether ``import vllm`` can work here (without importing it)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


if os.environ.get("KVCY_REQUIRE_VLLM") == "1":
    import vllm

    assert vllm.__version__ == "0.33.0", f"KVCY_REQUIRE_VLLM=1 but vLLM is {vllm.__version__}"

live = pytest.mark.skipif(not vllm_importable(), reason="vLLM 0.33.0 is not importable here")


def require_vllm() -> Any:
    """vLLM 0.33.0, for a module whose every test needs it: returned, or the whole module
    skipped where vLLM is missing or another version.  Under ``KVCY_REQUIRE_VLLM=1`` (CI's vLLM
    step) a missing or wrong vLLM fails at import instead of skipping."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if os.environ.get("KVCY_REQUIRE_VLLM") != "1" and not vllm_importable():
        pytest.skip("vLLM 0.33.0 is not importable here (see .ci/run's vLLM step)", allow_module_level=True)
    import vllm

    if vllm.__version__ != "0.33.0":
        if os.environ.get("KVCY_REQUIRE_VLLM") == "1":
            raise AssertionError(f"KVCY_REQUIRE_VLLM=1 but vLLM is {vllm.__version__}")
        pytest.skip(f"kvcy targets vLLM 0.33.0, found {vllm.__version__}", allow_module_level=True)
    return vllm
