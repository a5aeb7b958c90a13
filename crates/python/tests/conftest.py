import os
import uuid

import pytest


@pytest.fixture
def chan_name():
    """A unique channel name; its /dev/shm entry is removed afterwards even if the test fails."""
    name = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        os.unlink(f"/dev/shm/shmpipe-{name}")
    except FileNotFoundError:
        pass


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
