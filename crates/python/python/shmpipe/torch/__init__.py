"""shmpipe for PyTorch: :class:`DataLoader`, a drop-in for ``torch.utils.data.DataLoader``
whose workers hand batches to the trainer through shared memory, zero-copy.

    from shmpipe.torch import DataLoader          # instead of torch.utils.data.DataLoader

    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=4,
                        persistent_workers=True)
    for x, y in loader:                           # tensors over shmpipe pool blocks
        ...

Importing this module starts the fork server the workers are forked from, unless
``SHMPIPE_TORCH_EAGER=0`` is set: a fork of this process made here if it has only one
thread and no shared memory mapped (ready at once; ``SHMPIPE_TORCH_FORK=0`` turns this
off), else a fresh interpreter that imports torch in the background.
"""

from __future__ import annotations

import os

from torch.utils.data import get_worker_info

from . import _procs
from ._loader import DataLoader
from ._share import SharedArrayList

__all__ = ["DataLoader", "SharedArrayList", "get_worker_info", "warm_up"]

warm_up = _procs.warm_up

# Last: the fork server may be a fork made here, which takes this module as it is now.
if os.environ.get(_procs.EAGER_ENV, "1") != "0":
    _procs.warm_up(fork=True)
