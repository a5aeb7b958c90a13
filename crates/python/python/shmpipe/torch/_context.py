"""shmpipe's own fork server and the multiprocessing context that starts processes from it.

``multiprocessing`` has one fork server per process (``multiprocessing.forkserver``'s
module-level instance, what ``get_context("forkserver")`` uses): a server started at
``import shmpipe.torch`` would be the program's own, with torch preloaded and the
environment frozen as it was at the import, for every forkserver child the program (or
torch's ``DataLoader`` with ``multiprocessing_context="forkserver"``) starts later (trial 19).
So the workers come from a :class:`~multiprocessing.forkserver.ForkServer` instance of our
own (:data:`SERVER`, the same class and protocol) through :data:`CONTEXT`; the process-wide
server is left to the program and starts, as without shmpipe, at its first use.
"""

from __future__ import annotations

import io
import os
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util

#: The fork server of shmpipe's workers (started by ``_procs.warm_up`` or ``_forked.start``).
SERVER = forkserver.ForkServer()


class _Popen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` with :data:`SERVER` instead of the process-wide server."""

    def _launch(self, process_obj):
        # popen_forkserver.Popen._launch (Python 3.11-3.13), on SERVER.
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = SERVER.connect_to_new_process(self._fds)
        # A duplicate of the data pipe's write end: the child's sentinel of this process.
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


class _Context(context.ForkServerContext):
    Process = _Process


#: Starts processes forked from :data:`SERVER` (start method "forkserver").
CONTEXT = _Context()
