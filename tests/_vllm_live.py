"""What the test modules with live checks against vLLM 0.33.0 share: whether it imports here,
the ``live`` marker that skips a test where it does not, and CI's ``KVCY_REQUIRE_VLLM=1``
(the vLLM step: a broken install fails at import, never skips).
"""

from __future__ import annotations

import importlib.util
import os

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
