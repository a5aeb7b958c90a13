"""shmpipe: numpy arrays between processes through shared memory, zero-copy.

Channels (one producer process -> one consumer process)::

    tx = shmpipe.Sender.create("frames")            # producer
    buf = tx.loan((1000, 3), np.float32)            # writable array inside shared memory
    buf[:] = 1.0
    tx.send({"x": buf}, meta={"id": 7})             # zero-copy: the consumer reads that memory

    rx = shmpipe.Receiver.open("frames", timeout=5) # consumer (another process)
    msg = rx.recv()
    msg["x"]        # writable numpy view into shared memory; msg.meta == {"id": 7}

    tx.send_many({"x": xs}, meta={"id": ids})       # many small records in one call
    batch = rx.recv_many()                          # batch["x"]: every record's x, stacked

Views (every one: slices, ``np.asarray``, memoryview, DLPack, torch tensors, as they all keep
the array's base object alive):

- A loaned array holds its pool block: the block is not reused until the consumer released it
  and the last view of the loan is gone, and it stays mapped, even after ``close()``. So no
  view ever shows another message or reads unmapped memory; each loaned array you keep costs a
  block (``del buf`` after ``send``), and ``loan()`` raises ``PoolExhausted`` rather than wait
  forever when such arrays hold every block. (A loan below ``threshold=`` is an ordinary
  zeroed array that ``send`` copies, as it copies any small array: no block, stays writable.)
- ``send`` makes the loaned array, and every view made from it afterwards, read-only. Views
  made before the ``send`` keep numpy's write access: writing through them changes what the
  consumer reads.
- A received array is writable (its blocks are the receiver's alone) and holds its message:
  the block goes back to the producer when the last view of it is garbage, and not before.
- The peer process may change the values under a zero-copy view, never its bounds.

Blocking calls release the GIL and answer Ctrl-C; numpy memory is read only with the GIL held.

Timeouts, everywhere in the package (channels, ``Pipeline.enqueue`` / ``dequeue``): ``timeout=``
is in seconds; ``None`` (and ``float("inf")``) waits as long as it takes; ``0`` does not wait;
past the time the call raises ``TimeoutError`` (a negative or NaN value: ``ValueError``). The
default is ``None`` wherever a call waits for the other side (``recv``, ``recv_many``,
``send``, ``send_many``, ``loan``, ``wait_for_consumer``, ``enqueue``, ``dequeue``), and ``0``
for ``Receiver.open``, which waits for a name to appear only when asked (a wrong name fails
at once).

Context managers: ``Sender``, ``Receiver``, ``Pipeline`` and the loaders close at the end of a
``with`` block (and when garbage collected).
Details and the reasons: ``crates/python/README.md``.

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
    Records,
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
    "Records",
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
    and call ``Receiver.from_fd(fd)`` there (the receiver takes its own duplicate).
    """

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        """The descriptor of the channel's memfd (pass it in ``pass_fds`` to a subprocess)."""
        return self._fd

    def open(self) -> Receiver:
        """Opens the channel (the handle stays valid; each open takes its own descriptor)."""
        return Receiver.from_fd(self._fd)

    def close(self) -> None:
        """Closes this handle's descriptor (receivers already opened from it stay open)."""
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
