"""Loading Python steps and sources inside worker processes (and checking them in the parent)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import types
from typing import Any, Callable


class NotImportable(ValueError):
    """A step that a worker process cannot load."""


def describe(f: Any) -> str:
    return getattr(f, "__qualname__", None) or type(f).__qualname__


def step_spec(f: Any) -> dict:
    """The spec a worker loads ``f`` from; raises NotImportable with the reason and the fix.

    Steps travel to the workers like ``multiprocessing``'s spawn start method sends its
    targets: pickled, i.e. functions and classes *by reference* (module + qualified name).
    A lambda, a function defined inside another function, or one defined in a notebook or an
    interactive session cannot be found by name in a fresh interpreter.
    """
    if not callable(f):
        raise TypeError(f"a step is a callable or the name of a built-in step, not {f!r}")
    qual = getattr(f, "__qualname__", "") or ""
    mod = getattr(f, "__module__", None)
    fix = ("define it with `def` at the top level of a module (a .py file) and import it "
           "from there, as multiprocessing's spawn start method requires")
    if "<lambda>" in qual:
        raise NotImportable(f"step {qual!r} is a lambda: worker processes cannot import it; {fix}")
    if "<locals>" in qual:
        raise NotImportable(f"step {qual!r} is defined inside a function: worker processes "
                            f"cannot import it; {fix}")
    main_path = None
    if mod == "__main__" or (isinstance(f, object) and type(f).__module__ == "__main__"
                             and not isinstance(f, (types.FunctionType, type))):
        main = sys.modules.get("__main__")
        main_path = getattr(main, "__file__", None)
        if main_path is None:
            raise NotImportable(f"step {qual!r} is defined in a notebook or an interactive "
                                f"session: worker processes cannot import it; {fix}")
        main_path = os.path.abspath(main_path)
    try:
        blob = pickle.dumps(f)
    except Exception as e:  # noqa: BLE001 - pickling raises many types
        raise NotImportable(f"step {qual!r} cannot be sent to worker processes ({e}); {fix}") from e
    return {"pickle": base64.b64encode(blob).decode(), "main_path": main_path, "name": describe(f)}


def _runs_script(main_path: str) -> bool:
    """Whether this process's ``__main__`` is that script (the parent itself, with
    ``workers=0``): it must not run a second time."""
    f = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        return f is not None and os.path.samefile(f, main_path)
    except OSError:
        return False


def _fixup_main(main_path: str | None) -> None:
    # The parent's script runs as `__mp_main__` (its `if __name__ == "__main__":` block does
    # not run), and pickles referring to `__main__` find its functions: multiprocessing's way.
    if main_path and "__mp_main__" not in sys.modules and not _runs_script(main_path):
        from multiprocessing.spawn import _fixup_main_from_path

        _fixup_main_from_path(main_path)


# An item that is not a dict travels as {VALUE: item} (see `shmpipe.Pipeline`).
VALUE = "__shmpipe_value__"

# One output even though iterable.
_SINGLE = (str, bytes, bytearray, memoryview)


def _single(o: Any) -> bool:
    return isinstance(o, _SINGLE) or type(o).__module__ == "numpy" or not hasattr(o, "__iter__")


class Runner:
    """Calls a step and normalises its result to a list of dicts (flat-map semantics)."""

    def __init__(self, fn: Callable[[dict], Any]):
        self.fn = fn

    @staticmethod
    def _outputs(r: Any) -> list:
        if r is None:
            return []
        if isinstance(r, dict):
            return [r]
        if _single(r):
            return [{VALUE: r}]
        return [o if isinstance(o, dict) else {VALUE: o} for o in r]

    def process(self, item: dict) -> list:
        if len(item) == 1 and VALUE in item:
            item = item[VALUE]
        return self._outputs(self.fn(item))

    def finish(self) -> list:
        fin = getattr(self.fn, "finish", None)
        return self._outputs(fin()) if callable(fin) else []


def load_step(args_json: str, worker: int, workers: int, seed: int) -> Runner:
    spec = json.loads(args_json)
    _fixup_main(spec.get("main_path"))
    obj = pickle.loads(base64.b64decode(spec["pickle"]))
    if isinstance(obj, type):  # a class: one instance per worker (per-worker state)
        obj = obj()
    return Runner(obj)


def load_source(fd: int):
    with open(f"/proc/self/fd/{fd}", "rb") as f:
        main_path, blob = pickle.load(f)
    _fixup_main(main_path)
    return pickle.loads(blob)
