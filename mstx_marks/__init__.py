"""Mark the phases of training and RL jobs as MSTX ranges, on any machine.

>>> from mstx_marks import mark, mstx_range, instant, configure
>>> configure(backend="record")
>>> with mark("generate_sequences"):
...     instant("first_token")
"""

from .backends.record import Recorder, default_recorder
from .diagnostics import MstxMarksWarning
from .names import DEFAULT_DOMAIN, MAX_NAME_BYTES
from .phases import Phase
from .ranges import Mark, Range, instant, mark, mstx_range
from .records import InstantRecord, RangeRecord, RankTrace
from .sampling import every, first, window
from .settings import configure, current_backend, is_active, recording
from .status import Status, status

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
    "configure",
    "current_backend",
    "default_recorder",
    "every",
    "first",
    "instant",
    "is_active",
    "mark",
    "mstx_range",
    "recording",
    "status",
    "window",
]

__version__ = "0.1.0"

from . import env as _env

if _env.off():  # MSTX_MARKS_OFF=1: the hard off switch (see mstx_marks.off)
    from .off import instant, mark, mstx_range  # type: ignore[no-redef]
