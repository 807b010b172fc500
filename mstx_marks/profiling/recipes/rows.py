"""The profiler recipes' rows (:data:`RECIPES`), as the preset modules declare them beside their
presets (:data:`mstx_marks.capture.presets.RECIPES`), how a row finds the call it patches, and
the listing of ``mstx-marks recipes`` (:func:`recipes_table`).

>>> [r.name for r in RECIPES][:2]
['rollout_decode', 'vllm_offline_step']
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional

from mstx_marks.base import env
from mstx_marks.capture.presets import RECIPES
from mstx_marks.capture.presets.declare import Recipe
from mstx_marks.capture.presets.declare import RecipeTarget as Target
from mstx_marks.profiling.recipes.parse import KEYS

__all__ = ["BY_NAME", "DEFAULT_OUT", "RECIPES", "Recipe", "Target", "owner", "recipes_table"]

#: Where traces go when neither ``out=`` nor ``MSTX_MARKS_OUT`` says (the guide's ./outputs).
DEFAULT_OUT = "outputs"
#: The recipes by name.
BY_NAME: dict[str, Recipe] = {r.name: r for r in RECIPES}


def owner(module: ModuleType, target: Target) -> Optional[type]:
    """The class of ``module`` whose method ``target`` patches; None when this version has no
    such class or method."""
    owner_name, _, attr = target.path.rpartition(".")
    found = getattr(module, owner_name, None)
    if isinstance(found, type) and callable(getattr(found, attr, None)):
        return found
    return None


def recipes_table() -> str:
    """The listing of ``mstx-marks recipes``: each recipe, where it runs, what a step is, the
    folder it writes and the hand edit of the guide it replaces.

    >>> print(recipes_table().splitlines()[0])
    MSTX_MARKS_CAPTURE="RECIPE:wait=N,warmup=N,active=N[,repeat=N][,steps=[2,4]][,role=..][,...]"
    >>> "<out>/Ref_compute_log_prob" in recipes_table()
    True
    """
    lines = [
        f'{env.CAPTURE}="RECIPE:wait=N,warmup=N,active=N[,repeat=N][,steps=[2,4]][,role=..][,...]"',
        "keys: " + ", ".join(KEYS) + " (several recipes separated by ';')",
        f"traces in <out>/<folder>; <out> = out=, else {env.OUT}, else ./{DEFAULT_OUT}",
    ]
    for r in RECIPES:
        kinds = {
            "loop": "a new window each call",
            "after": "a step, stepped when it returns",
            "next": "a step, stepped when the next one starts or the loop returns",
        }
        where = [f"{m}:{p} ({kinds['loop' if k == 'loop' else b]})" for m, p, k, _, b in r.targets]
        lines += [
            "",
            r.name,
            "  runs in:   " + "\n             ".join(where),
            f"  a step:    {r.step}",
            f"  replaces:  {r.replaces}",
            f"  for:       {r.frameworks}",
            f"  folder:    <out>/{_folder_words(r)}",
        ]
        if r.roles:
            lines.append(f"  roles:     {', '.join(r.roles)} (role=...), steps=[...] verl steps")
    return "\n".join(lines)


def _folder_words(recipe: Recipe) -> str:
    tags = sorted({t.tag for t in recipe.targets})
    if "{tag}" in recipe.folder:
        return " or ".join(recipe.folder.format(tag=t) for t in tags)
    roles = "{" + ",".join(r for r in recipe.roles if r != "ref") + "}"
    return recipe.folder.format(role=roles, Role="", backend="{fsdp,megatron}")
