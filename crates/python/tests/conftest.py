import os
import signal
import sys
import uuid

import pytest

# A run started in the background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT
# ignored, and so does every child it starts: the Ctrl-C tests would then wait for an
# interruption that never comes (seen: test_ctrl_c_interrupts_a_blocked_recv_within_200ms hung
# under `nohup bash .ci/run &`). With a handler installed here, the children, which exec,
# start with SIGINT at its default and Python installs its own.
signal.signal(signal.SIGINT, signal.default_int_handler)

# The benchmarks' data generators (bench/series_files.py) serve the tests too.
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "bench"))


def socket_dir():
    """Where named channels' sockets live by default (shm-ring's `Rendezvous::socket_dir`)."""
    if os.environ.get("SHMPIPE_DIR"):
        return os.environ["SHMPIPE_DIR"]
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "shmpipe")
    if os.geteuid() == 0:
        st = os.lstat("/run")
        if st.st_uid == 0 and st.st_mode & 0o022 == 0:
            return "/run/shmpipe"
    return f"/tmp/shmpipe-{os.geteuid()}"


@pytest.fixture
def chan_name():
    """A unique channel name; a socket it left is removed afterwards even if the test fails,
    and nothing of it may ever appear in /dev/shm."""
    name = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        os.unlink(os.path.join(socket_dir(), name))
    except FileNotFoundError:
        pass
    assert not [n for n in os.listdir("/dev/shm") if name in n], "a named channel in /dev/shm"


@pytest.fixture
def kill_on_exit():
    """Processes registered here are killed at the end of the test."""
    procs = []
    yield procs
    for p in procs:
        if p.poll() is None if hasattr(p, "poll") else p.is_alive():
            p.kill()
        if hasattr(p, "wait"):
            p.wait()
        else:
            p.join()
