"""``Closing``: the context manager and garbage-collection hook of every object that holds
processes or shared memory and frees them in ``close()``."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T", bound="Closing")


class Closing:
    """``with obj:`` calls ``obj.close()`` at the end of the block (exceptions pass on), and
    so does garbage collection; subclasses define ``close()`` (safe to call repeatedly)."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, half-built objects
            pass
