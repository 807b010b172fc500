"""Where each step's time went, live, in the trainer's own logger: every process of the job
together, for every step, under ``mstx/...`` keys (:mod:`.figures` lists them).

Armed with the presets from the environment alone (``MSTX_MARKS_OUT`` and
``MSTX_MARKS_INSTRUMENT=verl,...``; ``MSTX_MARKS_LIVE=0`` turns it off): activation calls
:func:`arm`, which fills the slot that the verl preset's wrapper of
``verl.utils.tracking.Tracking.log`` calls through (:mod:`mstx_marks.capture.live_slot`: the
preset sits below the analysis and cannot import it). The first log call of a ``Tracking`` then
starts a :class:`~.steps.LiveSteps` in that process (verl's trainer), which follows the job's
files under ``MSTX_MARKS_OUT`` and analyses each step with ``summary``'s own model
(:mod:`.steps` says how and when). Nothing of it runs in the other processes but their writer
thread's beat (:mod:`mstx_marks.export.live_beat`), and only once the trainer asked for it.

>>> import os
>>> os.environ["MSTX_MARKS_LIVE"] = "0"
>>> arm("/tmp/prof")
False
>>> del os.environ["MSTX_MARKS_LIVE"]
"""

from __future__ import annotations

from pathlib import Path

from mstx_marks.base import env
from mstx_marks.capture import live_slot

__all__ = ["arm", "disarm"]


def arm(out_dir: str | Path | None = None) -> bool:
    """Give every trainer logger of this process live step figures from the files under
    ``out_dir`` (default ``MSTX_MARKS_OUT``); whether it did (not with ``MSTX_MARKS_LIVE=0``,
    ``MSTX_MARKS_OFF``, nor without a folder). Cheap: nothing starts before a logger's first
    call."""
    folder = out_dir if out_dir is not None else env.text(env.OUT)
    if folder is None or env.off() or not env.flag(env.LIVE, default=True):
        return False

    def factory() -> live_slot.StepLogger:
        from mstx_marks.live.steps import LiveSteps

        return LiveSteps(Path(folder))

    live_slot.fill(factory)
    return True


def disarm() -> None:
    """Leave the loggers' calls their own again (for tests)."""
    live_slot.empty()
