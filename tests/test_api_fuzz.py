"""The compiled twin survives wrong types and counts at its public boundary.

Cython with bounds checks off must validate what it is given; each fuzz run is a separate
interpreter so that a crash fails the test instead of ending the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcy import _fast

pytestmark = pytest.mark.skipif("cython" not in _fast.available() or _fast.NO_EXTENSIONS,
                                reason="compiled twins not in use")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_public_api_survives_garbage(seed):
    script = Path(__file__).with_name("_api_fuzz.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(script), str(seed), "1000"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"the interpreter died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    assert lines and lines[-1] == "done", proc.stdout[-3000:]
    assert lines == ["done"], "exceptions that bad input should not raise:\n" + "\n".join(lines[:-1])
