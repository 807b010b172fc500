"""Stand-ins for the parts of an Ascend software stack that vllm-ascend imports, on a CPU machine.

THESE ARE STAND-INS FOR CANN AND ITS PYTHON BINDINGS. ``import torch_npu`` needs CANN's shared
libraries (its ``_C`` links libascendcl, libhccl, ...), so on a machine without them every
``torch_npu`` module (and ``torch.npu``, which torch_npu installs) is replaced here by a stub
module whose unknown attributes are made on first use: a capitalised name becomes a class (so
that vllm-ascend can subclass or annotate with it), any other name a callable stub (calling it
gives a falsy :class:`Placeholder`; it may also be read as a submodule). The few values that
steer vllm-ascend's code are set explicitly (one device, an A2 SoC's name and version), and
what torch_npu's import does to torch is done (``torch.npu``, the ``npu`` device name,
``torch.distributed.is_hccl_available``). Nothing here runs a kernel: the worker under test gets
a stand-in model runner (see ``npu_worker_run.py``). MSTX does not go through these stubs: the
runner records with ``MSTX_MARKS_BACKEND=record``.

``install()`` must run before vllm-ascend (or vLLM's platform detection, which loads
vllm-ascend's ``vllm.platform_plugins`` entry point) is imported. ``created()`` lists every
stubbed name that was touched, for the report.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

#: Top-level packages that exist only on an Ascend machine (CANN and its Python bindings).
STUBBED = ("torch_npu", "torchair", "npugraph_ex", "acl", "triton_ascend")
#: Stubbed only when not installed: PyPI has no CPU build of torchvision (its wheels need CUDA
#: torch's libraries), and transformers' Qwen2-VL image and video processors import it at
#: module level; vllm-ascend's worker imports them through its Qwen3.5 patch. Nothing calls them.
STUBBED_IF_ABSENT = ("torchvision",)
#: What ``torch_npu.npu.get_soc_name()`` / ``get_soc_version()`` report: an Atlas A2 (910B1),
#: vllm-ascend's main target (its sdist built with ``SOC_VERSION=ascend910b1`` says A2 as well).
SOC_NAME = "Ascend910B1"
SOC_VERSION = 220

_created: list[str] = []


class Placeholder:
    """Whatever an unknown stubbed function returns: every use gives another placeholder.

    Falsy, empty and zero, so that import-time feature probes take their "absent" branch.
    """

    def __init__(self, name: str = "placeholder") -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"<npu stub {self._name}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return Placeholder(f"{self._name}()")

    def __getitem__(self, key: Any) -> Any:
        return Placeholder(f"{self._name}[]")

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _StubClassMeta(type):
    """Stub classes accept any class-level attribute read (``torch_npu.npu.Event.foo``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{cls.__module__}.{cls.__qualname__}.{name}")


class StubModule(types.ModuleType):
    """A stub package: attributes nobody set are made on first read (and remembered)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        value: Any
        if name[:1].isupper() and not name.isupper():
            value = _StubClassMeta(name, (), {"__module__": self.__name__, "__init__": _any_init})
        else:
            value = StubCallable(full)
        _created.append(full)
        setattr(self, name, value)
        return value


class StubCallable(StubModule):
    """A lower-case stub name: a function (calling it gives a :class:`Placeholder`) that may
    also be a submodule (``torch.npu.memory.NPUPluggableAllocator``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return Placeholder(f"{self.__name__}()")


def _any_init(self: Any, *args: Any, **kwargs: Any) -> None:
    pass


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every import of a :data:`STUBBED` package (and its submodules) with a stub."""

    def __init__(self) -> None:
        self.stubbed = set(STUBBED)

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname.partition(".")[0] not in self.stubbed:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        _created.append(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        _configure(module)


def _configure(module: types.ModuleType) -> None:
    """The values vllm-ascend reads at import or worker set-up, set to an A2 machine's."""
    name = module.__name__
    if name == "torch_npu":
        module.__version__ = "2.10.0.post4"  # type: ignore[attr-defined]
    elif name == "torch_npu.npu":
        module.is_available = lambda: True  # type: ignore[attr-defined]
        module.device_count = lambda: 1  # type: ignore[attr-defined]
        module.current_device = lambda: 0  # type: ignore[attr-defined]
        module.get_soc_name = lambda: SOC_NAME  # type: ignore[attr-defined]
        module.get_soc_version = lambda: SOC_VERSION  # type: ignore[attr-defined]


_finder = _Finder()


def install() -> None:
    """Put the finder first on ``sys.meta_path``, and ``torch.npu`` in place (torch_npu's
    import would install it). Idempotent."""
    if _finder not in sys.meta_path:
        for name in STUBBED_IF_ABSENT:
            if importlib.util.find_spec(name) is None:
                _finder.stubbed.add(name)
        sys.meta_path.insert(0, _finder)
    import torch
    import torch_npu.npu as npu  # the stub, made by the finder

    sys.modules["torch.npu"] = npu
    torch.npu = npu  # type: ignore[attr-defined]
    # What torch_npu's import does first, so that torch.device("npu") parses (no backend
    # behind it: nothing is ever allocated there).
    if torch._C._get_privateuse1_backend_name() != "npu":
        from torch.utils import backend_registration

        backend_registration.rename_privateuse1_backend("npu")
    # torch_npu adds it to torch.distributed (vllm-ascend's netloader imports it by name).
    import torch.distributed

    if not hasattr(torch.distributed, "is_hccl_available"):
        torch.distributed.is_hccl_available = lambda: True  # type: ignore[attr-defined]


def install_in_children(folder: Path) -> None:
    """Have every Python process this one starts install the stubs too (vLLM inspects a model's
    architecture in a fresh interpreter): a ``sitecustomize.py`` in ``folder``, put first on
    ``PYTHONPATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    here = str(Path(__file__).resolve().parent)
    (folder / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {here!r})\nimport npu_stubs\nnpu_stubs.install()\n"
        f"sys.path.remove({here!r})\n"
    )
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(folder) if not old else f"{folder}{os.pathsep}{old}"


def created() -> list[str]:
    """Every stubbed module and attribute made so far, in order."""
    return list(_created)
