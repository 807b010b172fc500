"""What a preset module declares, as plain data: the names it answers to (:class:`Preset`), the
plugin entry points that bring it into a framework's processes (:class:`EntryPoint`), and the
profiler recipes beside it (:class:`Recipe`, :class:`RecipeTarget`).

A preset is one module in ``mstx_marks/capture/presets/``. The package finds it by its
``PRESETS`` and derives every list from what it declares (``docs/guides/write-a-preset.md``):

- ``PRESETS``: a tuple of :class:`Preset`, the names ``MSTX_MARKS_INSTRUMENT`` takes;
- ``TARGETS``: a tuple of :class:`~mstx_marks.capture.presets.target.Target`, where each
  preset patches (its ``framework`` is one of the module's preset names);
- optional: ``BUILT`` (:class:`~mstx_marks.capture.presets.built.Built`, the hot-path object
  checked when built), ``PHASES`` (the :class:`~mstx_marks.base.phases.Phase` names only this
  module emits, registered with the package), ``RECIPES`` (its profiler recipes),
  ``RECIPE_TARGETS`` (calls it adds to another module's recipes, by recipe name) and ``ORDER``
  (where it is listed; modules without one follow, by name).

>>> p = Preset("tinyrl", ("tinyrl",), entry_points=(EntryPoint("tinyrl.plugins"),))
>>> p.entry_points[0].value("tinyrl")
'mstx_marks.launch.plugins:tinyrl'
"""

from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["PLUGINS", "EntryPoint", "Preset", "Recipe", "RecipeTarget"]

#: The module the frameworks' plugin entry points load (:mod:`mstx_marks.launch.plugins`).
PLUGINS = "mstx_marks.launch.plugins"


class EntryPoint(NamedTuple):
    """A plugin entry point a framework loads in the processes it starts, named ``mstx_marks``
    in ``group``; pyproject.toml holds it (a test keeps the two equal)."""

    group: str
    #: True: the framework calls what it loads (``mstx_marks.launch.plugins:<preset>``);
    #: False: it only imports the module, which activates mstx_marks as it is imported.
    call: bool = True

    def value(self, preset: str) -> str:
        """The entry point's object reference, as pyproject.toml writes it."""
        return f"{PLUGINS}:{preset}" if self.call else PLUGINS


class Preset(NamedTuple):
    """One name of ``MSTX_MARKS_INSTRUMENT``, as its module declares it."""

    name: str
    #: Distribution names to ask for the framework's version (the first one installed wins).
    distributions: tuple[str, ...]
    #: Named on its own (per-module hooks, one recipe's markers): listed after the framework
    #: presets, and not among those ``doctor`` checks the installed engines against.
    on_its_own: bool = False
    #: Other names it answers to (``vllm_ascend`` for ``vllm``).
    aliases: tuple[str, ...] = ()
    entry_points: tuple[EntryPoint, ...] = ()
    #: Markdown for the presets page (``docs/reference/presets.md``): where it patches, and the
    #: ranges it emits. Left empty, the page lists its targets' paths and phases instead.
    where: str = ""
    ranges: str = ""


class RecipeTarget(NamedTuple):
    """One call a profiler recipe patches: ``kind`` loop (a new window per call), iteration
    (one step) or stage (one verl step of its worker: what ``steps=`` counts)."""

    module: str
    path: str
    kind: str
    #: What runs there: vllm, sglang, fsdp, megatron, legacy_fsdp, legacy_megatron, verl.
    tag: str
    #: For iterations: step "after" the call, or at the "next" iteration and the loop's end.
    boundary: str = "after"


class Recipe(NamedTuple):
    """One profiler recipe (:mod:`mstx_marks.profiling.recipes`): the calls it patches, what a
    step is, what it replaces."""

    #: The recipe's name (``MSTX_MARKS_CAPTURE="NAME:..."``, ``capture(NAME)``).
    name: str
    targets: tuple[RecipeTarget, ...]
    #: Which calls count as a step.
    step: str
    #: The hand edit of the guide it replaces (one line).
    replaces: str
    #: Frameworks and versions the targets were checked in; where it cannot attach.
    frameworks: str
    #: The trace folder under ``<out>``: ``{tag}``, ``{role}``, ``{Role}``, ``{backend}``.
    folder: str
    #: The roles whose loops it captures (verl recipes); empty: any process.
    roles: tuple[str, ...] = ()
    #: For verl engine loops: the ``forward_only`` the loop call must have.
    forward_only: Optional[bool] = None
    #: The worker calls that are one verl step each (what ``steps=`` counts, and whose worker
    #: holds verl's profiler); empty: the recipe runs where no such step is known.
    stages: tuple[RecipeTarget, ...] = ()
    #: (module, what) pairs: once ``module`` is imported, the recipe says that it cannot reach
    #: ``what`` there (verl's legacy Megatron actor).
    unreachable: tuple[tuple[str, str], ...] = ()
