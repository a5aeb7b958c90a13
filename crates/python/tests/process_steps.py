"""Steps used by test_pipeline_fork.py and test_pipeline_process.py (importable by the worker
processes)."""

import os


def ident(item):
    return item


def exit_3_on_5(item):
    """Ends its worker the way a careless library does, without a word to the pipeline."""
    if item["n"] == 5:
        os._exit(3)
    return item
