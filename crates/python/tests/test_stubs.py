"""The type stubs of the native module (``_native.pyi``) say what the module has: mypy's
``stubtest`` compares them with the built module (names, signatures, defaults, properties)."""

import os
import subprocess
import sys

import pytest


def test_native_stubs_match_the_module():
    pytest.importorskip("mypy.stubtest", reason="mypy is in the [test] extra")
    env = dict(os.environ, MYPY_CACHE_DIR=os.devnull)
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "shmpipe._native"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "Success" in r.stdout
