"""Not an entry point: pipeline workers run ``python -c "...worker_main()"`` with the
arguments :class:`shmpipe.Pipeline` gives them (see ``Pipeline._child_args``). Importing this
module by hand calls ``worker_main``, which says that workers are started by
``shmpipe.Pipeline``.
"""

from shmpipe._native import worker_main

worker_main()
