"""Hostile steps used by test_review16_*.py (importable by the worker processes)."""

import os
import socket
import struct


def _ctrl_socket():
    """The worker's control socket to the pipeline's parent (its one SOCK_SEQPACKET)."""
    for n in os.listdir("/proc/self/fd"):
        try:
            fd = int(n)
            if not os.readlink(f"/proc/self/fd/{n}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        if s.type == socket.SOCK_SEQPACKET:
            return s
        s.close()
    raise RuntimeError("no control socket")


def forge_exit_at_3(item):
    """At item 3: announce EXIT 0 as the pipeline's own code would, then exit with 0."""
    if item["n"] == 3:
        s = _ctrl_socket()
        s.send(bytes([9, 0]) + struct.pack("<Q", 0))
        os._exit(0)
    return item


def garbage_then_exit_at_3(item):
    """At item 3: write garbage control messages, then die with an odd code."""
    if item["n"] == 3:
        s = _ctrl_socket()
        for body in [b"", b"\xff", bytes([9, 200]) + b"\xff" * 8, bytes([7, 0]) + b"\xff\xfe" * 100,
                     bytes([1, 5]), bytes([8, 0]) + struct.pack("<Q", 2**64 - 1)]:
            try:
                s.send(body)
            except OSError:
                pass
        os._exit(2)
    return item


def fork_at_3(item):
    """At item 3 the worker forks; both copies return the item to the worker loop."""
    if item["n"] == 3:
        os.fork()
    return item


def scribble_parent_memfds_at_5(item):
    """At item 5: overwrite every memfd the parent holds with random bytes (what a hostile
    worker of the same user can reach through /proc/<ppid>/fd)."""
    if item["n"] == 5:
        import random
        rnd = random.Random(item.get("seed", 1))
        base = f"/proc/{os.getppid()}/fd"
        for n in os.listdir(base):
            try:
                if not os.readlink(f"{base}/{n}").startswith("/memfd:"):
                    continue
                fd = os.open(f"{base}/{n}", os.O_RDWR)
            except OSError:
                continue
            try:
                size = os.fstat(fd).st_size
                junk = rnd.randbytes(1 << 16)
                for off in range(0, min(size, 1 << 20), 1 << 16):
                    os.pwrite(fd, junk[:size - off], off)
            except OSError:
                pass
            finally:
                os.close(fd)
    return item


def close_all_fds_at_3(item):
    """At item 3: close every descriptor above 2 (the control socket, channels, pidfds)."""
    if item["n"] == 3:
        for n in os.listdir("/proc/self/fd"):
            if int(n) > 2:
                try:
                    os.close(int(n))
                except OSError:
                    pass
    return item


def exit_code_at_3(item):
    """At item 3: exit with one of the pipeline's own codes (4: lost a peer), unannounced."""
    if item["n"] == 3:
        os._exit(item.get("code", 4))
    return item
