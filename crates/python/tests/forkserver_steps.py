"""Datasets and process steps for test_torch_forkserver.py (the fork server's lifecycle).

They live in an importable module because workers import what they run."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch.utils.data import Dataset

from procs import gone


class WhereAmI(Dataset):
    """Sample i: (i, whether the worker's fork server was made the shmpipe way: the
    environment that marks our processes, and the preload module imported before the fork)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        ours = os.environ.get("SHMPIPE_TORCH_CHILD") == "1"
        preloaded = "shmpipe.torch._preload" in sys.modules
        return torch.tensor([i, int(ours), int(preloaded)])


def server_pid() -> int | None:
    """The pid of the fork server shmpipe's workers come from in this process."""
    from shmpipe.torch import _procs
    return _procs._fork_server()._forkserver_pid


def epoch() -> list:
    from shmpipe.torch import DataLoader
    return [b.tolist() for b in DataLoader(WhereAmI(), batch_size=2, num_workers=2)]


def expected() -> list:
    return [[[i, 1, 1], [i + 1, 1, 1]] for i in range(0, 8, 2)]


def report(where: str) -> None:
    """One epoch of a loader with workers in this process, printed as a JSON line."""
    try:
        out = {"where": where, "batches": epoch(), "server": server_pid()}
    except Exception as e:  # noqa: BLE001 - the test prints what went wrong
        out = {"where": where, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)


def wait_gone(pid: int) -> None:
    """Waits until process ``pid`` has exited (the test's run limit bounds the wait)."""
    while not gone(pid):
        time.sleep(0.02)


def rss_anon_mib(pid: int) -> int:
    """The anonymous memory resident in process ``pid`` (what a fork of it keeps), MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) >> 10
    raise RuntimeError("no RssAnon in /proc/pid/status")
