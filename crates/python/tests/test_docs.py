"""``help()`` on the package is enough to use it: every public class, method and function has
a docstring, and every signature shows real defaults (no ``Ellipsis`` for a default PyO3
cannot print)."""

import inspect

import shmpipe
import shmpipe.timeseries


def _public(module):
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        yield name, obj
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            for k, v in vars(obj).items():
                if not k.startswith("_"):
                    yield f"{name}.{k}", getattr(obj, k)


def test_every_public_name_has_a_docstring_and_a_true_signature():
    thin, ellipsis = [], []
    for module in (shmpipe, shmpipe.timeseries):
        for name, obj in _public(module):
            doc = inspect.getdoc(obj) or ""
            if len(doc) < 20:
                thin.append(name)
            if callable(obj):
                try:
                    sig = str(inspect.signature(obj))
                except (TypeError, ValueError):
                    continue
                if "Ellipsis" in sig or "=..." in sig:
                    ellipsis.append(f"{name}{sig}")
    assert not thin, f"no or a thin docstring: {thin}"
    assert not ellipsis, f"defaults shown as Ellipsis: {ellipsis}"
