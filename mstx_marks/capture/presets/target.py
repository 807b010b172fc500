"""One row of a framework preset (:class:`Target`), how its ranges are made (:class:`Options`),
and the two common ways a row patches its target (:func:`wrap_calls`, :func:`named_per_call`).

The framework modules beside this one are tables of these rows.

>>> Target("vllm", "vllm.v1.engine.core", "EngineCore.step", "vllm_one_step", ">=0.11").patch
<function wrap_calls at ...>
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

from mstx_marks.base.phases import Phase, canonical
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.core.engine import rewrap
from mstx_marks.core.ranges import Mark
from mstx_marks.core.sampling import Policy

__all__ = ["Options", "Patch", "Target", "named_per_call", "wrap_calls"]


@dataclass(frozen=True)
class Options:
    """How a preset's ranges are made: stream, sampling (all phases, or per phase)."""

    stream: object = None
    sample: Policy | None = None
    #: Policies by canonical phase name (``MSTX_MARKS_SAMPLE``); beats ``sample``.
    phase_samples: Mapping[str, Policy] = field(default_factory=dict)
    #: verl continuous mode: also emit our range where verl's profiler emits its own.
    duplicate_verl: bool = False

    def policy(self, name: str) -> Policy | None:
        try:
            key = canonical(name)
        except KeyError:
            key = name
        return self.phase_samples.get(key, self.phase_samples.get(name, self.sample))

    def site(self, name: str | Phase, domain: str | None = None) -> Mark:
        """A fresh range site (its own sampling counter) for one target."""
        text = name.name if isinstance(name, Phase) else name
        return Mark(name, domain=domain, stream=self.stream, sample=self.policy(text))


Patch = Callable[[Any, str, "Target", Options], Instrumented]


def wrap_calls(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """The plain way: every call of ``owner.attr`` is one range named ``target.phase``."""
    site = options.site(target.phase, target.domain)
    return replace(owner, attr, lambda o, a, raw: rewrap(raw, site.wrap))


def named_per_call(
    classify: Callable[[Any, Any], str | None], names: tuple[str, ...]
) -> Callable[[Any, str, Target, Options], Instrumented]:
    """A patch under which each call of ``f(self, arg, ...)`` is a range named
    ``classify(self, arg)`` (one of ``names``), or no range when it gives None: an engine step
    by what its batch holds, an idle poll not at all. ``classify`` must not raise."""

    def patch(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
        sites = {name: options.site(name, target.domain) for name in names}

        def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(raw)
            def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                name = classify(self, args[0] if args else None)
                if name is None:
                    return raw(self, *args, **kwargs)
                with sites[name]:
                    return raw(self, *args, **kwargs)

            return call

        return replace(owner, attr, wrap)

    return patch


class Target(NamedTuple):
    """One place a framework does work: ``module``'s ``path`` (``Class.attr`` or a module
    global), emitted as ``phase`` (in ``domain``), patched by ``patch``, for ``versions``."""

    framework: str
    module: str
    path: str
    phase: str
    versions: str
    patch: Patch = wrap_calls
    domain: str | None = None
