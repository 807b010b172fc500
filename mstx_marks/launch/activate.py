"""Activation by environment alone: what the ``MSTX_MARKS_*`` variables ask, in this process.

:func:`activate` runs wherever a process of the job starts: from the frameworks' own plugin
entry points (``vllm.general_plugins`` in vLLM's EngineCore and worker processes,
``verl.plugins`` at ``import verl``, ``sglang.srt.plugins`` in SGLang's scheduler), from the
launcher's start-up hook (``mstx-marks run -- CMD``, for every child Python process), or from
Ray's ``worker_process_setup_hook="mstx_marks.activate"``. It then:

- ``MSTX_MARKS_OUT=DIR``: records every range and writes them under DIR (:mod:`.export.out`),
  DIR made absolute first, in the environment too, so neither a later ``os.chdir`` nor a child
  started in another folder moves it; a DIR that cannot be made or written (a probe file
  decides) is said in one line, and nothing is recorded;
- ``MSTX_MARKS_INSTRUMENT=verl,vllm,...``: arms those presets (patched when imported);
- ``MSTX_MARKS_SAMPLE="PHASE=POLICY;..."``: samples those phases in the presets;
- ``MSTX_MARKS_CAPTURE="RECIPE:wait=..;..."``: arms those profiler recipes.

With no ``MSTX_MARKS_*`` variable set it does nothing at all. It never raises: a bad value
warns once, naming the variable, the value (cut: :func:`~mstx_marks.base.env.quoted`) and the
rule, and the job runs on; a name with our prefix that is no variable (a typo) warns with the
closest known name.

>>> parse_instrument("verl, vllm")
('verl', 'vllm')
>>> sorted(parse_samples("vllm_one_step=window(30,70); gen=every(2)"))
['generate_sequences', 'vllm_one_step']
"""

from __future__ import annotations

import os

from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn
from mstx_marks.base.forking import new_lock
from mstx_marks.base.phases import canonical
from mstx_marks.core.sampling import Policy, parse_policy

__all__ = ["activate", "activate_at_import", "parse_instrument", "parse_samples"]

_lock = new_lock()
_done_in: int | None = None


def parse_instrument(text: str | None) -> tuple[str, ...]:
    """The preset names of ``MSTX_MARKS_INSTRUMENT`` (an alias given as its preset's name);
    unknown ones warn, with the closest known name, and are skipped.

    >>> parse_instrument("verl, vllm_ascend,vllm")
    ('verl', 'vllm')
    """
    from mstx_marks.capture.presets import preset_name

    names: list[str] = []
    unknown: list[str] = []
    for raw in (text or "").split(","):
        name = raw.strip().lower().replace("-", "_")
        if not name:
            continue
        try:
            name = preset_name(name)
        except ValueError as exc:
            if not unknown:  # the first with its reason (the closest name); the rest counted
                # (the reason quotes the name too: cut, as long as its list of presets)
                unknown.append(f"{env.quoted(name)}: {str(exc)[: 2 * env.QUOTE].strip()}")
            elif len(unknown) <= _NAMED:
                unknown.append(env.quoted(name))
            else:
                unknown.append("")
            continue
        if name not in names:
            names.append(name)
    if unknown:
        # One warning for the variable: 3,000 bad names must not be 3,000 lines.
        rest = [u for u in unknown[1:] if u]
        more = f"; also unknown: {', '.join(rest)}" if rest else ""
        if len(unknown) - 1 > len(rest):
            more += f" (and {len(unknown) - 1 - len(rest)} more)"
        warn(f"ignoring {unknown[0]}{more} in {env.INSTRUMENT}={env.quoted(text or '')}")
    return tuple(names)


#: How many unknown preset names after the first a warning names.
_NAMED = 5


def parse_samples(text: str | None) -> dict[str, Policy]:
    """``MSTX_MARKS_SAMPLE``'s ``PHASE=POLICY`` pairs (``;``-separated), keyed by canonical phase
    name; bad pairs are skipped, with one warning for the variable (naming the first bad pair
    and the rule, how many more there were, and the value cut short).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     parse_samples("a=bad;" * 1000)
    {}
    >>> len(w), len(str(w[0].message)) < 400
    (1, True)
    """
    found: dict[str, Policy] = {}
    bad: list[str] = []
    for pair in (text or "").split(";"):
        if not pair.strip():
            continue
        phase, sep, policy = pair.partition("=")
        phase = phase.strip()
        try:
            if not sep or not phase:
                raise ValueError("expected PHASE=POLICY, e.g. vllm_one_step=window(30, 70)")
            try:
                key = canonical(phase)
            except KeyError:
                key = phase  # a name the registry does not know is still a name ranges have
            found[key] = parse_policy(policy)
        except ValueError as exc:
            if not bad:
                bad.append(f"{env.quoted(pair.strip())}: {str(exc)[: env.QUOTE]}")
            else:
                bad.append("")
    if bad:
        more = f" (and {len(bad) - 1} more bad pairs)" if len(bad) > 1 else ""
        warn(f"ignoring {bad[0]}{more} in {env.SAMPLE}={env.quoted(text or '')}")
    return found


def activate() -> None:
    """Apply the ``MSTX_MARKS_*`` variables in this process (once; again in a forked child is
    not needed: patches and arming are inherited, and the recorder follows the fork)."""
    global _done_in
    with _lock:
        if _done_in is not None or not env.any_set():
            return
        _done_in = os.getpid()
    env.say_unknown_names()  # said at import unless set since; each name once
    if env.off():  # the hard off switch: nothing is patched, nothing recorded, said once
        asked = [v for v in (env.OUT, env.INSTRUMENT, env.CAPTURE) if env.text(v) is not None]
        if asked:
            warn(f"{env.OFF}=1: {', '.join(asked)} ignored, nothing is recorded in this process")
        return
    try:
        _activate()
    except Exception as exc:  # activation runs inside the frameworks' start-up: never break it
        warn(f"activation from the environment failed ({type(exc).__name__}: {exc})")


def activate_at_import() -> None:
    """What ``import mstx_marks`` runs when ``MSTX_MARKS_OUT`` is set: :func:`activate`, so any
    process that imports the library records and writes there as a launched one does (its
    periodic spill and its signal wake-up too, which is what survives Ray's quick exit).
    Idempotent, and it never raises: an import must not fail for a recording."""
    try:
        if env.text(env.OUT) is not None:
            activate()
    except Exception:  # activate() warns and never raises; this is for what it cannot catch
        pass


def _activate() -> None:
    out = env.text(env.OUT)
    if out is not None:
        from mstx_marks.export.out import cannot_write, record_to

        folder = _absolute_out(out)
        problem = cannot_write(folder)
        if problem is None:
            record_to(folder)
            from mstx_marks.launch import ray_clock

            ray_clock.arm()
        else:  # one line now: not a recording that waits in memory and fails again at exit
            warn(f"{problem}: nothing is recorded or written for {env.OUT} in this process")
    frameworks = parse_instrument(env.text(env.INSTRUMENT))
    if frameworks:
        from mstx_marks.capture.presets import arm
        from mstx_marks.capture.presets.target import Options

        options = Options(phase_samples=parse_samples(env.text(env.SAMPLE)))
        for framework in frameworks:
            arm(framework, options)
        if out is not None:  # each step's figures to a trainer's logger (MSTX_MARKS_LIVE)
            from mstx_marks.live import arm as arm_live

            arm_live(os.environ.get(env.OUT, out))
    capture = env.text(env.CAPTURE)
    if capture is not None:
        from mstx_marks.profiling.recipes import arm_from_text

        arm_from_text(capture)


def _absolute_out(out: str) -> str:
    """``MSTX_MARKS_OUT`` as an absolute path, resolved now and put back in the environment: a
    relative one would follow the program's later ``os.chdir`` (the exit's files landing
    elsewhere, or nowhere), and the processes it starts, in other folders, would each read it
    against their own."""
    try:
        folder = os.path.abspath(out)
    except OSError as exc:  # the current folder was removed: nothing to resolve against
        warn(f"{env.OUT}={env.quoted(out)} is relative and the current folder is gone ({exc})")
        return out
    os.environ[env.OUT] = folder
    return folder
