"""shmpipe: numpy arrays between processes through shared memory, zero-copy.

Channels (one producer process -> one consumer process)::

    tx = shmpipe.Sender.create("frames")            # producer
    buf = tx.loan((1000, 3), np.float32)            # writable array inside shared memory
    buf[:] = 1.0
    tx.send({"x": buf}, meta={"id": 7})             # zero-copy: the consumer reads that memory

    rx = shmpipe.Receiver.open("frames", timeout=5) # consumer (another process)
    msg = rx.recv()
    msg["x"]        # read-only numpy view into shared memory; msg.meta == {"id": 7}

The block goes back to the producer when the last view of it (and anything made from one,
e.g. ``torch.from_numpy``) is garbage. Blocking calls release the GIL and answer Ctrl-C.

Pipelines (steps in worker processes): see :class:`shmpipe.Pipeline`; the GluonTS loader:
:mod:`shmpipe.timeseries`.
"""

from __future__ import annotations

import os

from ._native import (
    CorruptMessage,
    Disconnected,
    Lease,
    Loan,
    Message,
    PeerDied,
    PipelineError,
    PoolExhausted,
    Receiver,
    Sender,
    ShmpipeError,
    StepError,
    WorkerDied,
)

__all__ = [
    "CorruptMessage",
    "Disconnected",
    "Lease",
    "Loan",
    "Message",
    "PeerDied",
    "PipelineError",
    "PoolExhausted",
    "Receiver",
    "ReceiverHandle",
    "Sender",
    "ShmpipeError",
    "StepError",
    "WorkerDied",
    "pipe",
]


class ReceiverHandle:
    """The receiving end of an anonymous channel, before it is opened.

    Picklable for ``multiprocessing`` children (any start method: the descriptor travels
    with ``multiprocessing.reduction.DupFd``, as multiprocessing does for its own pipes):
    pass it as an argument of ``Process(target=..., args=(handle,))`` and call
    :meth:`open` in the child. For ``subprocess``, pass ``handle.fileno()`` in ``pass_fds``
    and call ``Receiver.from_fd(os.dup(fd))`` there.
    """

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def open(self) -> Receiver:
        """Opens the channel (the handle stays valid; each open takes its own descriptor)."""
        return Receiver.from_fd(os.dup(self._fd))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return (_rebuild_handle, (DupFd(self._fd),))


def _rebuild_handle(dup) -> ReceiverHandle:
    return ReceiverHandle(dup.detach())


def pipe(slots: int = 1024, blocks: int = 16, block_size: int = 1 << 20,
         threshold: int | None = None) -> tuple[Sender, ReceiverHandle]:
    """An anonymous channel (memfd, no name in /dev/shm): ``(sender, receiver_handle)``.

    Give the handle to a ``multiprocessing`` child (spawn, forkserver or fork) and call
    ``handle.open()`` there.
    """
    tx = Sender.anonymous(slots=slots, blocks=blocks, block_size=block_size, threshold=threshold)
    return tx, ReceiverHandle(os.dup(tx.fileno()))

from .pipeline import NamedSource, Pipeline, item_rng, item_seed  # noqa: E402

__all__ += ["NamedSource", "Pipeline", "item_rng", "item_seed"]
