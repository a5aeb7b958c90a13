"""Imported by the fork server alone (its preload list): what every worker would otherwise do
for itself, done once before the forks.

- torch, numpy and the worker's own modules are imported;
- the first ``torch.manual_seed`` and ``numpy.random.seed`` calls load lazily imported parts
  (20-50 ms each, several times that on a loaded machine): they are made here. The server's
  own generators are never used; every worker seeds its own (``_worker.setup``);
- the trainer's main script is imported as ``__mp_main__`` (what multiprocessing's fork
  server is meant to do, but Python 3.11 never passes it the script's path), so that workers
  do not each run it again. As under ``spawn``, the script's work must be under
  ``if __name__ == "__main__":``; if importing it fails here, a note goes to stderr and every
  worker imports it itself (and fails as it would under ``spawn``). ``sys.argv`` is the
  trainer's then (a module-level argparse parses the trainer's arguments); if it raises what is not
  an ``Exception`` (``sys.exit()`` outside the main guard), every worker tells the trainer,
  which raises it (``_procs.main_failed``).
"""

from __future__ import annotations

import json
import os
import sys

from multiprocessing import spawn

import numpy as np
import numpy.random  # noqa: F401
import torch

from . import _procs, _worker  # noqa: F401

torch.manual_seed(0)
np.random.seed(0)


def _fixup_main_from_path(path: str, _import=spawn._fixup_main_from_path) -> None:
    """What each worker does with the trainer's main script before it runs: a ``__main__``
    that is no file (``python -``, whose ``__file__`` is ``<stdin>``) cannot be imported, and
    made every worker die at its start ("exited unexpectedly"); it is left out, as for
    ``python -c`` (the trainer refuses a dataset that needs it: ``_workers``)."""
    if os.path.isfile(path):
        _import(path)


spawn._fixup_main_from_path = _fixup_main_from_path


def _import_main(path: str) -> None:
    from multiprocessing import process, spawn
    process.current_process()._inheriting = True
    try:
        spawn.import_main_path(path)
    except Exception as e:  # noqa: BLE001 - the workers will say what is wrong
        print(f"shmpipe.torch: the fork server could not import the main script {path} "
              f"({type(e).__name__}: {e}); each worker will import it itself. Keep the "
              f"script's work under `if __name__ == \"__main__\":`.", file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - sys.exit(), KeyboardInterrupt: see main_failed
        _procs.main_failed(e, path)
    finally:
        del process.current_process()._inheriting


_main = os.environ.get(_procs.MAIN_ENV)
if os.environ.get(_procs.ARGV_ENV):
    sys.argv = json.loads(os.environ[_procs.ARGV_ENV])
if _main:
    _import_main(_main)
