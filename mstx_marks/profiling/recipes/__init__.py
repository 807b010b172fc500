"""Profiler recipes: the seed guide's scheduled captures, without editing framework source.

The Ascend RL profiling guide (进阶指南, 精细化采集) has users hand-edit verl, vLLM, vllm-ascend or
SGLang: build a ``torch_npu.profiler.profile`` with a ``schedule`` in the function that runs one
loop, ``start()`` it, ``step()`` it at the end of each iteration and ``stop()`` it after the loop.
Each such edit is a named recipe here, with the guide's semantics:

- **a window per call of the loop's function**: the schedule starts anew in every call (every
  PPO step's ``forward_backward_batch`` / ``train_mini_batch`` gets its window); the decode-step
  recipe, whose profiler the guide builds in the worker's ``__init__``, runs once per process;
- **a step at the end of each iteration**: a micro-batch's window holds its forward AND its
  backward (the profiler steps when the next micro-batch starts and when the loop returns), a
  mini-batch's window its optimizer step;
- ``steps=[2,4]`` limits a verl recipe to those global steps (verl's count, as
  ``global_profiler.steps``: the n-th call of the stage in a worker is step n, which is verl's
  step when the job did not resume from a checkpoint) and ``role=`` to actor, critic or ref.

Arming waits for the framework module to be imported (it never imports it) and patches the calls
(:mod:`mstx_marks.profiling.windows`, the engine ``capture_steps`` runs on too). The profiler has
the guide's options (CPU and device activity, level1, db export, analyse on) with MSTX on, which
the guide's own ``_ExperimentalConfig(Level1, Db)`` leaves off. Each window is one trace folder
run (torch_npu makes one ``*_ascend_pt`` folder per profiler) under ``<out>/<folder>``, the
guide's folder names: ``vllm_profile``, ``sglang_profile``, ``Ref_compute_log_prob``,
``Actor_compute_log_prob``, ``{fsdp,megatron}_{actor,critic}_update_profile``,
``{fsdp,megatron}_{actor,critic}_update_micro_batch``, ``vllm_offline_profile``; ``<out>`` is
``out=``, else ``MSTX_MARKS_OUT``, else ``./outputs``.

From the environment, in every process of a job (several recipes separated by ``;``)::

    MSTX_MARKS_CAPTURE="update_micro_batch:wait=1,warmup=1,active=2,steps=[2,4],role=actor"

The same from Python:

>>> handle = capture("rollout_decode", wait=29, warmup=1, active=30)
>>> handle.total, handle.done
(60, False)
>>> handle.undo()
>>> handle.done
True

Annotation never breaks the workload: the wrapped call always runs and its exceptions pass
through untouched (the step still counts); a profiler that fails to build, start or step warns
once and the recipe disarms itself. ``python -m mstx_marks recipes`` prints :func:`recipes_table`.

The recipes' rows live beside their presets (each preset module's ``RECIPES``, gathered in
:data:`mstx_marks.capture.presets.RECIPES`); this package runs them: :mod:`.rows` (the rows and
their listing), :mod:`.parse` (``MSTX_MARKS_CAPTURE``'s text), :mod:`.verl_calls` (what a verl
call is: its role, backend and step) and :mod:`.captures` (arming, and each window's profiler).
"""

from __future__ import annotations

from mstx_marks.profiling.recipes.captures import Capture, arm_from_text, armed, capture
from mstx_marks.profiling.recipes.rows import DEFAULT_OUT, RECIPES, Recipe, Target, recipes_table

__all__ = [
    "DEFAULT_OUT",
    "RECIPES",
    "Capture",
    "Recipe",
    "Target",
    "arm_from_text",
    "armed",
    "capture",
    "recipes_table",
]
