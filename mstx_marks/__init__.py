"""Mark the phases of training and RL jobs as MSTX ranges, on any machine.

>>> from mstx_marks import mark, mstx_range, instant, configure
>>> configure(backend="record")
>>> with mark("generate_sequences"):
...     instant("first_token")

Everything a user calls is here. The range API is loaded with the package; the rest (the
recorder, the exporters, instrumentation, profiler helpers) is loaded on first use, so that
``import mstx_marks`` stays as cheap as ``import nvtx``. The package's own layout, one folder per
role, imports one way: ``base`` < ``backends`` < ``core`` < ``export`` < ``capture`` |
``analysis`` < ``profiling`` < ``launch`` < ``cli`` (``tests/test_layers.py`` holds it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mstx_marks.base import VERSION
from mstx_marks.base import env as _env
from mstx_marks.base.diagnostics import MstxMarksWarning
from mstx_marks.base.names import DEFAULT_DOMAIN, MAX_NAME_BYTES
from mstx_marks.base.phases import Phase
from mstx_marks.core.configuration import configure, current_backend, is_active, recording
from mstx_marks.core.ranges import Mark, Range, instant, mark, mstx_range
from mstx_marks.core.sampling import every, first, window

if TYPE_CHECKING:
    from mstx_marks.backends.record import Recorder, default_recorder
    from mstx_marks.base import phases
    from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace
    from mstx_marks.capture.instrument import instrument
    from mstx_marks.capture.nn_modules import instrument_modules
    from mstx_marks.capture.presets.verl import marked_timer
    from mstx_marks.core.status import Status, status
    from mstx_marks.export.out import flush_at_exit
    from mstx_marks.launch.activate import activate
    from mstx_marks.profiling.recipes import capture

__all__ = [
    "DEFAULT_DOMAIN",
    "MAX_NAME_BYTES",
    "InstantRecord",
    "Mark",
    "MstxMarksWarning",
    "Phase",
    "Range",
    "RangeRecord",
    "RankTrace",
    "Recorder",
    "Status",
    "activate",
    "capture",
    "configure",
    "current_backend",
    "default_recorder",
    "every",
    "first",
    "flush_at_exit",
    "instant",
    "instrument",
    "instrument_modules",
    "is_active",
    "mark",
    "marked_timer",
    "mstx_range",
    "phases",
    "recording",
    "status",
    "window",
]

__version__ = VERSION

#: Public names loaded on first use: name -> (module, attribute; "" for the module itself).
_LAZY = {
    "Recorder": ("mstx_marks.backends.record", "Recorder"),
    "default_recorder": ("mstx_marks.backends.record", "default_recorder"),
    "phases": ("mstx_marks.base.phases", ""),
    "InstantRecord": ("mstx_marks.base.records", "InstantRecord"),
    "RangeRecord": ("mstx_marks.base.records", "RangeRecord"),
    "RankTrace": ("mstx_marks.base.records", "RankTrace"),
    "instrument": ("mstx_marks.capture.instrument", "instrument"),
    "instrument_modules": ("mstx_marks.capture.nn_modules", "instrument_modules"),
    "marked_timer": ("mstx_marks.capture.presets.verl", "marked_timer"),
    "Status": ("mstx_marks.core.status", "Status"),
    "status": ("mstx_marks.core.status", "status"),
    "flush_at_exit": ("mstx_marks.export.out", "flush_at_exit"),
    "activate": ("mstx_marks.launch.activate", "activate"),
    "capture": ("mstx_marks.profiling.recipes", "capture"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'mstx_marks' has no attribute {name!r}") from None
    found = importlib.import_module(module)
    value = getattr(found, attr) if attr else found
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


# A mistyped MSTX_MARKS_* name is said now, once (one pass over the environment, 13 us for 40
# variables), not left to a doctor the user has no reason to run.
_env.say_unknown_names()

# MSTX_MARKS_OUT set: this process records and writes there like a launched one, whatever
# imported the library (a plain `MSTX_MARKS_OUT=prof python train.py`, a Ray actor given only
# runtime_env env_vars). Unset: nothing more is imported. Idempotent; never raises.
if _env.text(_env.OUT):
    from mstx_marks.launch.activate import activate_at_import

    activate_at_import()
