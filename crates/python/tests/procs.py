"""Process checks shared by the pipeline tests."""

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))


def run_python(code=None, limit=60, env=None, path=None):
    """Runs `code` (or the script at `path`) in a fresh interpreter in its own session (cwd:
    the tests directory, so the step modules beside the tests import); (returncode, output
    with stderr), returncode None if it was still running after `limit` seconds (then its
    whole process group is killed)."""
    args = [sys.executable, path] if path else [sys.executable, "-c", textwrap.dedent(code)]
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.Popen(args, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True, env=full_env)
    try:
        out, _ = p.communicate(timeout=limit)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        return None, out


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def children() -> set:
    """The pids of this process's children (read from /proc)."""
    me = str(os.getpid())
    out = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.add(int(p))
            except OSError:
                pass
    return out


def mapping_of(addr: int) -> str:
    """The /proc/self/maps line of the mapping that holds ``addr`` ("" if none)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.strip()
    return ""
