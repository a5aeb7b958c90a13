"""Loading Python steps inside worker processes (and checking them in the parent)."""

from __future__ import annotations

import ast
import base64
import json
import os
import pickle
import sys
import types
from typing import Any


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
        top = qual.split(".")[0] if isinstance(f, (types.FunctionType, type)) \
            else type(f).__qualname__.split(".")[0]
        if _under_main_guard(main_path, top):
            raise NotImportable(
                f"step {qual!r} is defined under `if __name__ == \"__main__\":` of "
                f"{os.path.basename(main_path)}: worker processes import the script without "
                f"running that block, so they cannot find it; define it at the top level of "
                f"the script (above the `if`), or in a module you import")
    try:
        blob = pickle.dumps(f)
    except Exception as e:  # noqa: BLE001 - pickling raises many types
        raise NotImportable(f"step {qual!r} cannot be sent to worker processes ({e}); {fix}") from e
    return {"pickle": base64.b64encode(blob).decode(), "main_path": main_path, "name": describe(f)}


def _main_guard(node: ast.stmt) -> str | None:
    """Which branch of ``node`` only the main script runs: ``"body"`` for
    ``if __name__ == "__main__":``, ``"orelse"`` for ``if __name__ != "__main__":`` (either
    side of the comparison), else None."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return None
    t = node.test
    sides = [t.left, *t.comparators]
    if not (len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq))
            and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)):
        return None
    return "body" if isinstance(t.ops[0], ast.Eq) else "orelse"


def _defined(body: list, guarded: bool, out: dict) -> None:
    """Names bound by ``def``/``class``/assignments in ``body`` (into nested ``if``/``try``/
    ``with`` blocks), each marked whether only the main guard binds it. The guard covers its
    own branch only: the ``else:`` (or ``elif``) of ``if __name__ == "__main__":`` is what
    the workers run."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = out.get(node.name, True) and guarded
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out[t.id] = out.get(t.id, True) and guarded
        main_only = _main_guard(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            sub = getattr(node, field, None)
            if isinstance(sub, list):
                _defined(sub, guarded or field == main_only, out)


def _under_main_guard(main_path: str, name: str) -> bool:
    """Whether the script binds ``name`` only inside ``if __name__ == "__main__":`` (where
    the workers, importing it as ``__mp_main__``, never see it). ``False`` when the script
    cannot be read or parsed, or is too deeply nested to check (``RecursionError``,
    ``MemoryError``): the workers then report what they find."""
    try:
        with open(main_path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), main_path)
        names: dict = {}
        _defined(tree.body, False, names)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return names.get(name, False)


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


def fuse(specs: list) -> list:
    """Consecutive Python steps as one ``python`` step: a worker then passes an item from
    one callable to the next as the Python object it is, converting it once on the way in
    and once on the way out (errors still name the callable that raised). ``specs``: the
    pipeline's ``StepSpec``s (name, JSON arguments); built-in steps stay as they are."""
    groups: list = []  # (spec, the arguments of its Python callables or None)
    for s in specs:
        if s.name == "python" and groups and groups[-1][1] is not None:
            groups[-1][1].append(json.loads(s.args))
        else:
            groups.append((s, [json.loads(s.args)] if s.name == "python" else None))
    return [s if steps is None else type(s)("python", json.dumps({"steps": steps}))
            for s, steps in groups]


def load_step(spec_json: str, worker: int, workers: int, seed: int) -> Any:
    """The callable a worker runs for one step spec: a class gives one instance per worker
    (per-worker state). A step returns ``None`` (no output), a list, tuple or iterator
    (0..n outputs: flat-map) or any other value (one output, usually the dict it was given)."""
    spec = json.loads(spec_json)
    _fixup_main(spec.get("main_path"))
    obj = pickle.loads(base64.b64decode(spec["pickle"]))
    if isinstance(obj, type):  # a class: one instance per worker (per-worker state)
        obj = obj()
    return obj
