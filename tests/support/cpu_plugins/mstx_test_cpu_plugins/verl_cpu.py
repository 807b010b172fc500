"""A ``cpu`` platform for verl 0.9.1, loaded through verl's ``verl.plugins`` entry point.

verl 0.9.1 has no CPU platform: with no accelerator it falls back to ``nvidia`` and calls
``torch.cuda``. Importing this module (verl does it at ``import verl``, while ``verl/__init__``
still runs) registers ``PlatformCPU``, which verl's auto-detection picks when CUDA is absent:

- device ``cpu``: ``get_device_id()`` is ``torch.device("cpu")`` (verl moves tensors and modules
  to it), collective backend ``gloo``;
- Ray resource ``GPU``: the job asks Ray for logical GPUs (``ray_init.num_gpus``), so verl's
  resource pools and placement work unchanged;
- no CUDA IPC: verl then syncs the actor's weights to vLLM through shared memory.

Two verl spots that assume an accelerator are adjusted too, in this process only:
``torch.distributed.init_process_group`` gets verl's ``cpu:gloo,<device>:<backend>`` string with
its duplicate removed (``cpu:gloo,cpu:gloo`` is refused), and FSDP2's ``CPUOffloadPolicy`` (verl
hard-codes ``pin_memory=True`` for the reference model) never pins, as pinning needs CUDA.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from collections.abc import Iterator
from typing import Any, Optional

import torch

__all__: list[str] = []  # importing the module is what it does


def _total_memory() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _available_memory() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


class _CpuDevice(types.ModuleType):
    """What verl calls on ``get_torch_device()`` (``torch.cuda`` on GPUs), for the CPU: memory
    figures from the OS, the RNG from torch, and no-ops for caches and streams."""

    def __init__(self) -> None:
        super().__init__("mstx_test_cpu_plugins.cpu_device")
        self.is_available = lambda: True
        self.current_device = lambda: _CPU
        self.device_count = lambda: 1
        self.set_device = _nothing
        self.synchronize = _nothing
        self.empty_cache = _nothing
        self.ipc_collect = _nothing
        self.reset_peak_memory_stats = _nothing
        self.memory_allocated = _zero
        self.max_memory_allocated = _zero
        self.memory_reserved = _zero
        self.max_memory_reserved = _zero
        self.mem_get_info = lambda *a, **k: (_available_memory(), _total_memory())
        self.get_device_name = lambda *a, **k: "cpu"
        self.manual_seed = torch.manual_seed
        self.manual_seed_all = torch.manual_seed
        self.get_rng_state = lambda *a, **k: torch.get_rng_state()
        self.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
        self.is_initialized = lambda: True

    def __getattr__(self, name: str) -> Any:
        # Anything else torch.cpu has (Stream, StreamContext, current_stream, ...).
        return getattr(torch.cpu, name)


_CPU = torch.device("cpu")
_DEVICE = _CpuDevice()


def _dedup_backend(init_process_group: Any) -> Any:
    @functools.wraps(init_process_group)
    def init(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "," in backend:
            parts = list(dict.fromkeys(p.strip() for p in backend.split(",") if p.strip()))
            kwargs["backend"] = ",".join(parts)
        return init_process_group(*args, **kwargs)

    init.__mstx_test_dedup__ = True  # type: ignore[attr-defined]
    return init


def _unpinned_offload_policy() -> None:
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy
    except ImportError:  # an old torch: verl's FSDP2 is not there either
        return
    if getattr(CPUOffloadPolicy.__init__, "__mstx_test_unpinned__", False):
        return
    original = CPUOffloadPolicy.__init__

    @functools.wraps(original)
    def init(self: Any, pin_memory: bool = True, *args: Any, **kwargs: Any) -> None:
        original(self, False, *args, **kwargs)

    init.__mstx_test_unpinned__ = True  # type: ignore[attr-defined]
    CPUOffloadPolicy.__init__ = init  # type: ignore[method-assign]


def _register() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return _DEVICE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return not torch.cuda.is_available()

        def current_device(self) -> Any:
            # verl uses it as a device (``model.to(get_device_id())``): an index would mean an
            # accelerator.
            return _CPU

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: Optional[int] = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for a logical GPU

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None


def _install() -> None:
    if torch.cuda.is_available():
        return
    _register()
    import torch.distributed as dist

    if not getattr(dist.init_process_group, "__mstx_test_dedup__", False):
        dist.init_process_group = _dedup_backend(dist.init_process_group)
    _unpinned_offload_policy()


_install()
