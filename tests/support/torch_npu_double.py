"""A test double of torch_npu's Python MSTX wrapper (``torch_npu/npu/mstx.py``, torch-npu 2.14.0).

It reproduces what callers can observe: signatures, return values, warning texts, which C function
gets which arguments, the swallowing of exceptions (one printed error line, result None), and the
quirks (``mark`` accepts domain ``''``; ``mstx_range`` has no try/finally and names its wrapper
``inner``; ``annotate`` with an empty message ends range 0 as a context manager).
tests/test_torch_npu_support.py checks it against the real file.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any, Callable

from support.fake_mstx_c import FakeTorchNpu

# The texts differ between methods ("function"/"func", "provide"/"input") exactly as upstream.
_BAD_MESSAGE = {
    "mark": "Invalid message for mstx.mark function. Please provide a valid message string.",
    "range_push": "Invalid message for mstx.range_push func. Please input valid message string.",
    "range_start": (
        "Invalid message for mstx.range_start function. Please provide a valid message string."
    ),
}
_BAD_DOMAIN = {
    "mark": "Invalid domain for mstx.mark function. Please provide a valid domain string.",
    "range_push": "Invalid domain for mstx.range_push func. Please input valid domain string.",
    "range_pop": "Invalid domain for mstx.range_pop func. Please input valid domain string.",
    "range_start": "Invalid domain for mstx.range_start func. Please input valid domain string.",
    "range_end": "Invalid domain for mstx.range_end func. Please input valid domain string.",
}
_BAD_STREAM = {
    "mark": "Invalid stream for mstx.mark function. Please provide a valid stream.",
    "range_push": "Invalid stream for mstx.range_push func. Please input valid stream.",
    "range_start": "Invalid stream for mstx.range_start func. Please input valid stream.",
}
_BAD_RANGE_ID = (
    "Invalid message for mstx.range_end function. "
    "Please provide the return value from mstx.range_start."
)


def _print_error_log(msg: str) -> None:
    # Same format as torch_npu.utils.utils._print_log at level ERROR.
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(time.time())))
    print(f"{now}({os.getpid()})-[ERROR] {msg}")


def _swallow(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as ex:
            _print_error_log(f"Call {func.__name__} failed. Exception: {ex!s}")
            return None

    return wrapper


def build_mstx_module(torch_npu: types.ModuleType) -> types.ModuleType:
    """A module standing in for ``torch_npu.npu.mstx``, bound to ``torch_npu`` as upstream is."""

    def emit(name: str, message: Any, stream: Any, domain: Any, dropped: Any) -> Any:
        # Evaluation order matters: `not x` runs before isinstance and may raise (then swallowed).
        if not message or not isinstance(message, str):
            warnings.warn(_BAD_MESSAGE[name], stacklevel=1)
            return dropped
        if (name != "mark" and not domain) or not isinstance(domain, str):
            warnings.warn(_BAD_DOMAIN[name], stacklevel=1)
            return dropped
        c = torch_npu._C._mstx  # type: ignore[attr-defined]
        if not stream:
            return getattr(c, f"_{name}_on_host")(message, domain)
        if not isinstance(stream, torch_npu.npu.streams.Stream):  # type: ignore[attr-defined]
            warnings.warn(_BAD_STREAM[name], stacklevel=1)
            return dropped
        return getattr(c, f"_{name}")(
            message, stream.stream_id, stream.device_index, stream.device_type, domain
        )

    class mstx:
        annotate: type[annotate]

        @staticmethod
        @_swallow
        def mark(message: str, stream: Any = None, domain: str = "default") -> None:
            emit("mark", message, stream, domain, None)

        @staticmethod
        @_swallow
        def range_push(message: str, stream: Any = None, domain: str = "default") -> int:
            return emit("range_push", message, stream, domain, -1)  # type: ignore[no-any-return]

        @staticmethod
        @_swallow
        def range_pop(domain: str = "default") -> int:
            if not domain or not isinstance(domain, str):
                warnings.warn(_BAD_DOMAIN["range_pop"], stacklevel=1)
                return -1
            return torch_npu._C._mstx._range_pop(domain)  # type: ignore[attr-defined,no-any-return]

        @staticmethod
        @_swallow
        def range_start(message: str, stream: Any = None, domain: str = "default") -> int:
            return emit("range_start", message, stream, domain, 0)  # type: ignore[no-any-return]

        @staticmethod
        @_swallow
        def range_end(range_id: int, domain: str = "default") -> None:
            if not isinstance(range_id, int):
                warnings.warn(_BAD_RANGE_ID, stacklevel=1)
                return
            if not domain or not isinstance(domain, str):
                warnings.warn(_BAD_DOMAIN["range_end"], stacklevel=1)
                return
            torch_npu._C._mstx._range_end(range_id, domain)  # type: ignore[attr-defined]

        @staticmethod
        @_swallow
        def mstx_range(message: str, stream: Any = None, domain: str = "default") -> Any:
            def wrapper(func: Callable[..., Any]) -> Callable[..., Any]:
                def inner(*args: Any, **kwargs: Any) -> Any:
                    range_id = mstx.range_start(message, stream, domain)
                    ret = func(*args, **kwargs)
                    mstx.range_end(range_id, domain)
                    return ret

                return inner

            return wrapper

    class annotate:
        def __init__(self, message: str = "", stream: Any = None, domain: str = "default") -> None:
            self.message = message
            self.stream = stream
            self.domain = domain
            self.range_id: Any = None

        def __enter__(self) -> annotate:
            self.range_id = mstx.range_start(self.message, self.stream, self.domain)
            return self

        def __exit__(self, *exc: object) -> None:
            if self.range_id is not None:
                mstx.range_end(self.range_id, self.domain)
                self.range_id = None

        def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
            if not self.message:
                self.message = func.__name__

            @functools.wraps(func)
            def inner(*args: Any, **kwargs: Any) -> Any:
                range_id = mstx.range_start(self.message, self.stream, self.domain)
                try:
                    return func(*args, **kwargs)
                finally:
                    mstx.range_end(range_id, self.domain)

            return inner

    mstx.annotate = annotate
    module = types.ModuleType("torch_npu.npu.mstx")
    module.mstx = mstx  # type: ignore[attr-defined]
    module.annotate = annotate  # type: ignore[attr-defined]
    module.__all__ = ["mstx", "annotate"]
    return module


@contextlib.contextmanager
def install_double(npu_available: bool = True) -> Iterator[FakeTorchNpu]:
    """Install a fake ``torch_npu`` whose ``npu.mstx`` is this double; restore sys.modules after."""
    env = FakeTorchNpu("double", npu_available)
    module = env.add(build_mstx_module(env.torch_npu))
    # `from .mstx import mstx` in torch_npu/npu/__init__.py rebinds the attribute to the class.
    env.torch_npu.npu.mstx = module.mstx  # type: ignore[attr-defined]
    with env.installed():
        yield env
