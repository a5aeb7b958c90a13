"""Steps used by test_pipeline_isolation.py (importable by the worker processes)."""

import os
import subprocess
import sys


def fd_links(pid="self"):
    """What each open descriptor of a process leads to."""
    out = {}
    base = f"/proc/{pid}/fd"
    for n in os.listdir(base):
        try:
            out[int(n)] = os.readlink(f"{base}/{n}")
        except OSError:
            pass
    return out


def report_fds(item):
    """Tags the item with this worker's memfd descriptors."""
    item["memfds"] = " ".join(sorted(v for v in fd_links().values() if v.startswith("/memfd:")))
    return item


def report_role(item):
    """Tags the item with whether the role variable is visible here and in a program this
    step starts."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('SHMPIPE_ROLE') is None)"],
        capture_output=True, text=True, check=True)
    item["role_here"] = int("SHMPIPE_ROLE" in os.environ)
    item["role_gone_in_child"] = int(child.stdout.strip() == "True")
    return item
