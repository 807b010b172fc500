"""Ranges around the modules of an ``nn.Module`` tree, as ``module_statistic`` reads them.

:func:`instrument_modules` adds a forward pre-hook and a forward hook to each chosen module: each
call of the module is one range in domain ``Module`` whose message is the module's class name,
the form the recipe documents (``range_start(type(self).__name__, domain="Module")``). The recipe
(msprof-analyze 26.2.0, ``recipes/module_statistic``) reads only ``eventType`` 2 ranges of that
domain, by host time, and rebuilds the hierarchy from time containment alone (a child range lies
inside its parent's), naming each row ``parent/child`` by class names; repeated layers of one
class under one parent with the same operators are summed into one row. So the messages carry
no path: nesting does. ``names="path"`` names each range by its dotted path instead (one row per
layer).

Backward: the recipe derives ``[Backward]`` rows itself from the autograd links between forward
and backward operators, so our own backward ranges (``backward=True``, full backward hooks) go to
domain ``ModuleBackward``: they show in the timeline and in Insight without being counted again
as forward modules.

Which modules: the root is depth 0, its children depth 1, and so on; ``depth`` bounds it (None:
no bound), ``include`` (shell patterns, ``fnmatch``) keeps only modules whose class name or path
matches. Containers that are never called (``ModuleList``, ``ModuleDict``) get no hooks. Wrappers
are transparent: FSDP's ``FullyShardedDataParallel``, ``DistributedDataParallel``,
``torch.compile``'s ``OptimizedModule`` and activation-checkpoint wrappers get no range, do not
count as a level, and their ``_fsdp_wrapped_module.`` / ``module.`` / ``_orig_mod.`` /
``_checkpoint_wrapped_module.`` path parts are dropped; FSDP2's ``FSDP<Class>`` classes are named
``<Class>``. Pre-hooks go first (``prepend=True``) and forward hooks are always called, also when
the forward raises, so a range spans FSDP's own unshard/reshard hooks and always ends.

Sampling: ``sample`` decides once per call of the root module (the model's forward), and every
range of that forward follows the decision, so a sampled forward is a whole tree.

``torch.compile``: with ``under_compile="skip"`` (the default) the hooks see
``torch.compiler.is_compiling()`` while Dynamo traces them and add nothing to the graph: modules
inside a compiled region get no ranges and no graph break. ``"break"`` runs the hooks outside the
graph (``torch.compiler.disable``): a graph break at every hooked module, and ranges as in eager.

Undo is exact: :meth:`ModuleHooks.undo` removes every hook and puts back the one attribute torch
sets when a full backward hook is registered (``_is_full_backward_hook``).

>>> import torch
>>> from mstx_marks import configure, default_recorder
>>> configure(backend="record")
>>> default_recorder().clear()
>>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
>>> with instrument_modules(net, depth=1):
...     _ = net(torch.ones(1, 2))
>>> [(r.name, r.domain) for r in default_recorder().records()]
[('Sequential', 'Module'), ('Linear', 'Module'), ('ReLU', 'Module')]
>>> net._forward_hooks, net._forward_pre_hooks
(OrderedDict(), OrderedDict())
"""

from __future__ import annotations

import fnmatch
import functools
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Literal, cast

from mstx_marks.base.checks import check_int, check_names
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.base.names import fit_name
from mstx_marks.base.phases import Phase, register
from mstx_marks.capture.instrument import LIVE, Instrumented, Patch, replace
from mstx_marks.core.ranges import Mark, Range
from mstx_marks.core.sampling import Decisions, Policy

__all__ = [
    "BACKWARD_DOMAIN",
    "MODULE_DOMAIN",
    "MODULE_FORWARD",
    "ModuleHooks",
    "class_name",
    "hook_after",
    "instrument_modules",
]

#: The domain ``module_statistic`` reads.
MODULE_DOMAIN = "Module"
#: Our backward ranges: not read by ``module_statistic`` (it derives backward rows itself).
BACKWARD_DOMAIN = "ModuleBackward"
#: The phase the module presets sample by (``MSTX_MARKS_SAMPLE="module_forward=every(10)"``):
#: one forward of a hooked model; its ranges are named by the modules' classes.
MODULE_FORWARD = register(
    Phase(
        "module_forward",
        MODULE_DOMAIN,
        framework="torch (mstx_marks.capture.nn_modules)",
        description="a hooked model's forward; each module call a range named by its class",
        emitted="preset",
    )
)

_WRAPPERS = {
    "FullyShardedDataParallel",
    "DistributedDataParallel",
    "OptimizedModule",
    "CheckpointWrapper",
    "OffloadWrapper",
}
_WRAPPER_PARTS = {"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module", "module"}
_CONTAINERS = {"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}

#: Modules hooked by a live :func:`instrument_modules`: a second call skips them.
_hooked: weakref.WeakSet[Any] = weakref.WeakSet()
_hooked_lock = new_lock()


def class_name(module: object) -> str:
    """The module's class name, with FSDP2's generated ``FSDP<Class>`` seen through.

    >>> class FSDPBlock: pass  # an ordinary class: its own name
    >>> class_name(FSDPBlock())
    'FSDPBlock'
    """
    for cls in type(module).__mro__:
        if not cls.__module__.startswith("torch.distributed.fsdp"):
            return cls.__name__
    return type(module).__name__


def _is_wrapper(module: object) -> bool:
    return type(module).__name__ in _WRAPPERS


def _walk(module: Any, path: str, depth: int) -> Iterator[tuple[Any, str, int]]:
    """(module, clean dotted path, depth) of the tree, wrappers seen through."""
    if _is_wrapper(module):
        for name, child in module.named_children():
            yield from _walk(child, path if name in _WRAPPER_PARTS else _join(path, name), depth)
        return
    yield module, path, depth
    for name, child in module.named_children():
        yield from _walk(child, path if name in _WRAPPER_PARTS else _join(path, name), depth + 1)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Stacks(threading.local):
    """Per thread: the open forward and backward entries, and the current sampling decision."""

    def __init__(self) -> None:
        self.fwd: list[tuple[int, Range | None]] = []
        self.bwd: list[tuple[int, Range | None]] = []
        self.keep_fwd = True
        self.keep_bwd = True


class ModuleHooks(Instrumented):
    """What :func:`instrument_modules` hooked; :meth:`undo` removes it all, exactly.

    ``patched`` lists the hooked modules as ``path (Class)`` (the root is ``<root>``),
    ``skipped`` pairs of (module, reason). A context manager too; ``undo()`` is idempotent.
    """

    def __init__(
        self,
        removers: list[Callable[[], None]],
        labels: list[str],
        skipped: list[tuple[str, str]],
        modules: list[Any],
    ) -> None:
        super().__init__((), skipped)
        self.patched = tuple(labels)
        self._removers = removers
        self._modules = modules

    def undo(self) -> None:
        """Remove every hook (newest first) and torch's backward-hook flag; then do nothing."""
        removers, self._removers = self._removers, []
        for remove in reversed(removers):
            try:
                remove()
            except Exception as exc:  # a module torn down under us: undo the rest anyway
                warn_once(("module undo", type(exc)), f"could not remove a module hook ({exc})")
        with _hooked_lock:
            for m in self._modules:
                _hooked.discard(m)
        self._modules = []


def _compiling() -> Callable[[], bool]:
    try:
        import torch

        found = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        if found is None:
            found = torch._dynamo.is_compiling
        return found  # type: ignore[no-any-return,unused-ignore]
    except Exception:
        return lambda: False


def _check_model(model: object) -> None:
    for attr in ("named_children", "register_forward_pre_hook", "register_forward_hook"):
        if not callable(getattr(model, attr, None)):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def _choose(
    model: Any, depth: int | None, include: list[str] | None
) -> Iterator[tuple[Any, str, int]]:
    for module, path, level in _walk(model, "", 0):
        if depth is not None and level > depth:
            continue
        if class_name(module) in _CONTAINERS:
            continue
        if include is not None:
            name = class_name(module)
            if not any(
                fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in include
            ):
                continue
        yield module, path, level


def instrument_modules(
    model: Any,
    depth: int | None = 2,
    *,
    include: Iterable[str] | None = None,
    sample: Policy | None = None,
    backward: bool = False,
    names: Literal["class", "path"] = "class",
    stream: object = None,
    under_compile: Literal["skip", "break"] = "skip",
) -> ModuleHooks:
    """Mark each call of the chosen modules of ``model`` as a range in domain ``Module``.

    ``depth``: deepest level hooked (root 0; None: all); ``include``: shell patterns on class name
    or dotted path; ``sample``: a policy over the root's calls; ``backward``: also a range per
    module backward (domain ``ModuleBackward``); ``names``: ``"class"`` (the recipe's form) or
    ``"path"``; ``stream``: as for :func:`~mstx_marks.mark` (host only by default, what the recipe
    reads); ``under_compile``: ``"skip"`` or ``"break"`` (module docstring). Bad arguments raise
    here; nothing raises while the model runs. Modules already hooked by a live call are skipped.

    >>> instrument_modules(object())
    Traceback (most recent call last):
    ...
    TypeError: model must be a torch.nn.Module, got object
    """
    _check_model(model)
    if depth is not None:
        try:
            depth = check_int(depth, "depth", 0)
        except ValueError as exc:
            raise ValueError(f"instrument_modules(depth=): must be >= 0, got {depth}") from exc
    patterns = None if include is None else check_names(include, "include")
    if names not in ("class", "path"):
        raise ValueError(f"names must be 'class' or 'path', got {names!r}")
    if under_compile not in ("skip", "break"):
        raise ValueError(f"under_compile must be 'skip' or 'break', got {under_compile!r}")
    if sample is not None and not isinstance(sample, Policy):
        raise TypeError(f"sample must be a sampling policy (every, first...), got {sample!r}")
    if not isinstance(backward, bool):
        raise TypeError(f"backward must be True or False, got {type(backward).__name__}")

    stacks = _Stacks()
    compiling = _compiling()
    fwd_decide: Decisions | None = None if sample is None else sample.decisions()
    bwd_decide: Decisions | None = None if sample is None else sample.decisions()
    removers: list[Callable[[], None]] = []
    labels: list[str] = []
    skipped: list[tuple[str, str]] = []
    hooked: list[Any] = []
    chosen = list(_choose(model, depth, patterns))
    if not chosen or chosen[0][0] is not model:
        chosen.insert(0, (model, "", -1))  # the root always counts forwards, for sampling
    try:
        for module, path, level in chosen:
            label = f"{path or '<root>'} ({class_name(module)})"
            with _hooked_lock:
                if module in _hooked:
                    skipped.append((label, "already instrumented"))
                    continue
                _hooked.add(module)
            hooked.append(module)
            text = fit_name(class_name(module) if names == "class" or not path else path)
            site = None if level < 0 else Mark(text, domain=MODULE_DOMAIN, stream=stream)
            is_root = module is model
            pre, post = _forward_hooks(site, stacks, is_root, fwd_decide, compiling)
            if under_compile == "break":
                pre, post = _outside_graph(pre), _outside_graph(post)
            removers.append(module.register_forward_pre_hook(pre, prepend=True).remove)
            removers.append(module.register_forward_hook(post, always_call=True).remove)
            if site is not None:
                labels.append(label)
            if backward and (site is not None or is_root):
                bsite = None if site is None else Mark(text, domain=BACKWARD_DOMAIN, stream=stream)
                bpre, bpost = _backward_hooks(bsite, stacks, is_root, bwd_decide)
                flag = module.__dict__.get("_is_full_backward_hook", _ABSENT)
                removers.append(_restore_flag(module, flag))
                removers.append(module.register_full_backward_pre_hook(bpre).remove)
                removers.append(module.register_full_backward_hook(bpost).remove)
    except BaseException:
        ModuleHooks(removers, labels, skipped, hooked).undo()
        raise
    return ModuleHooks(removers, labels, skipped, hooked)


_ABSENT = object()


def _restore_flag(module: Any, flag: object) -> Callable[[], None]:
    def put_back() -> None:
        if flag is _ABSENT:
            module.__dict__.pop("_is_full_backward_hook", None)
        else:
            module.__dict__["_is_full_backward_hook"] = flag

    return put_back


def _outside_graph(hook: Callable[..., None]) -> Callable[..., None]:
    import torch

    return torch.compiler.disable(hook, recursive=False)  # type: ignore[no-untyped-call,no-any-return,unused-ignore]


def _open(stack: list[tuple[int, Range | None]], key: int, site: Mark | None) -> None:
    # Sampling was decided per root forward: every hooked call under it is a range.
    stack.append((key, None if site is None else site.start(sampled=False)))


def _close(stack: list[tuple[int, Range | None]], key: int) -> None:
    # Hooks pair up LIFO per thread; an entry left by a forward that skipped its post-hook (a
    # torch without always_call) is ended here rather than left open for ever.
    while stack:
        k, opened = stack.pop()
        if opened is not None:
            opened.end()
        if k == key:
            return


def _forward_hooks(
    site: Mark | None,
    stacks: _Stacks,
    is_root: bool,
    decide: Decisions | None,
    compiling: Callable[[], bool],
) -> tuple[Callable[..., None], Callable[..., None]]:
    def pre(module: Any, args: Any) -> None:
        if compiling():
            return
        try:
            stack = stacks.fwd
            if not stack and decide is not None:
                stacks.keep_fwd = next(decide) if is_root else stacks.keep_fwd
            _open(stack, id(module), site if stacks.keep_fwd else None)
        except Exception as exc:
            warn_once(("module hook", type(exc)), f"module range start failed ({exc})")

    def post(module: Any, args: Any, output: Any) -> None:
        if compiling():
            return
        try:
            _close(stacks.fwd, id(module))
        except Exception as exc:
            warn_once(("module hook", type(exc)), f"module range end failed ({exc})")

    return pre, post


def _backward_hooks(
    site: Mark | None, stacks: _Stacks, is_root: bool, decide: Decisions | None
) -> tuple[Callable[..., None], Callable[..., None]]:
    def pre(module: Any, grad_output: Any) -> None:
        try:
            stack = stacks.bwd
            if not stack and decide is not None and is_root:
                stacks.keep_bwd = next(decide)
            _open(stack, id(module), site if stacks.keep_bwd else None)
        except Exception as exc:
            warn_once(("module hook", type(exc)), f"module backward range start failed ({exc})")

    def post(module: Any, grad_input: Any, grad_output: Any) -> None:
        try:
            _close(stacks.bwd, id(module))
        except Exception as exc:
            warn_once(("module hook", type(exc)), f"module backward range end failed ({exc})")

    return pre, post


class _Unhook(Patch):
    """A preset's "patch" of the models its loader hooked: undoing it unhooks each of them."""

    __slots__ = ()

    def __init__(self, hooked: list[Instrumented], label: str) -> None:
        super().__init__(hooked, "", None, object(), True, label)

    def current(self) -> Any:
        return self.installed  # nothing to be patched over: the hooks are the models' own

    def put_back(self) -> None:
        hooked = cast("list[Instrumented]", self.owner)
        while hooked:
            hooked.pop().undo()


def hook_after(
    get_models: Callable[[Any], Any], depth: int | None = 4, **kwargs: Any
) -> Callable[[Any, str, Any, Any], Instrumented]:
    """A preset patch: after each call of ``owner.attr(self, ...)`` (a model loader), hook the
    models ``get_models(self)`` gives (one module, a list of them, or None) with
    :func:`instrument_modules` (``depth``, ``kwargs``; sampled by the preset's policy for the
    target's phase). Undoing the preset restores the loader and unhooks every model it hooked.
    A model that cannot be hooked warns once; the loader's result is returned as it was."""

    def patch(owner: Any, attr: str, target: Any, options: Any) -> Instrumented:
        policy = options.policy(target.phase)
        label = f"{target.module}:{target.path}"
        hooked: list[Instrumented] = []

        def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(raw)
            def load(self: Any, *args: Any, **kw: Any) -> Any:
                out = raw(self, *args, **kw)
                try:
                    found = get_models(self)
                    models = found if isinstance(found, (list, tuple)) else [found]
                    for model in models:
                        if model is not None:
                            hooked.append(instrument_modules(model, depth, sample=policy, **kwargs))
                except Exception as exc:
                    warn_once(("module preset", label), f"{label}: modules not hooked ({exc})")
                return out

            return load

        loader = replace(owner, attr, wrap)
        # Undone first (undo goes newest first): the models' hooks, then the loader.
        unhook = _Unhook(hooked, f"{label} (models it hooked)")
        LIVE[unhook.installed] = unhook
        return Instrumented([*loader._patches, unhook], loader.skipped)

    return patch
