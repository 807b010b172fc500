"""Which backend a setting names, built here; ``auto`` chooses again once torch arrives.

Building never raises: a backend that cannot work here says so once and records nothing. The
``auto`` choice needs torch (:func:`mstx_marks.backends.detect`); a program that imports torch
after its first range gets the choice made then, through :func:`when_torch_arrives`.

>>> create("noop").name
'noop'
"""

from __future__ import annotations

from typing import Callable

from mstx_marks import backends
from mstx_marks.backends.base import Backend
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.core.process import BackendSpec

__all__ = ["create", "when_torch_arrives"]


def create(spec: BackendSpec) -> Backend:
    """The backend ``spec`` names (an instance is itself), or a noop one, said once, when it
    cannot work here."""
    if isinstance(spec, Backend):
        return spec
    try:
        return backends.create(spec)
    except Exception as exc:
        warn_once(
            ("unavailable", spec, str(exc)),
            f"backend {spec!r} cannot work here ({exc}); ranges are not recorded",
        )
        return backends.NoopBackend()


# One watch at a time: `auto` applied many times before torch arrives chooses again once.
_watching: list[bool] = []


def when_torch_arrives(choose_again: Callable[[], None]) -> None:
    """Call ``choose_again`` when the program imports torch (once, however often asked)."""
    if _watching:
        return
    _watching.append(True)

    def arrived(torch: object) -> None:
        _watching.clear()
        choose_again()

    when_imported("torch", arrived)
