"""Entry point of pipeline worker and emitter processes: ``python -m shmpipe._worker``.

Started by :class:`shmpipe.Pipeline` (never by hand): runs the child role given in the
``SHMPIPE_ROLE`` environment variable, then exits.
"""

from shmpipe._native import worker_main

worker_main()
