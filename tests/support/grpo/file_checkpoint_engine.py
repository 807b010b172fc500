"""A verl checkpoint engine that passes the actor's weights to the rollout through files.

verl's disaggregated modes (one-step-off, fully async) push the trainer's weights to separate
rollout workers through a checkpoint engine. verl 0.9.1 registers "naive" (colocated only)
everywhere, and nccl/nixl/delta (cupy), hccl (an NPU), kimi and mooncake (their libraries) where
those import: on a CPU-only machine none of the disaggregated ones. This one needs nothing but
torch and a folder both sides can read (one host, or a shared file system through
``engine_kwargs.file.root``). A job selects it with::

    actor_rollout_ref.rollout.checkpoint_engine.backend=file
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=file_checkpoint_engine

(the module importable in every Ray worker: tests/engines/verl_one_step_off.py puts this folder
on their ``PYTHONPATH``). One sync, as ``CheckpointEngineManager.update_weights`` drives it:

- ``prepare``: the actor's rank 0 (``is_master``) makes a fresh folder and returns its path;
- ``build_topology``: every worker gets that path; actor ranks first, then the rollout's;
- ``send_weights`` (actor): rank 0 writes the tensors in buckets of at most ``bucket_size``
  bytes (``bucket-00000.pt``, ..., each renamed into place once whole), then ``done.json``
  with their count and the step; the other actor ranks walk the generator (gathering a full
  tensor is collective over the actor group) and write nothing;
- ``receive_weights`` (rollout): yields each bucket's tensors as it appears, until
  ``done.json`` says there are no more;
- ``finalize``: rank 0 removes the folder (every side has read it by then).

Test support for tests/test_real_async.py, never part of the library.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Optional

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

__all__ = ["BACKEND", "FileCheckpointEngine"]

BACKEND = "file"
_DONE = "done.json"
_POLL_S = 0.02


def _bucket(folder: Path, index: int) -> Path:
    return folder / f"bucket-{index:05d}.pt"


def _write(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a reader polling for it never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _save(path: Path, tensors: list[tuple[str, torch.Tensor]]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(tensors, tmp)
    os.replace(tmp, path)


@CheckpointEngineRegistry.register(BACKEND)
class FileCheckpointEngine(CheckpointEngine):
    """Weights through files in a folder, a bucket at a time (see the module docstring).

    Args:
        bucket_size: the most bytes of tensors one file holds (a larger tensor gets its own).
        is_master: the actor's rank 0 (verl sets it on the actor side only): it makes the
            folder, writes the files and removes the folder.
        root: where the per-sync folders are made (default: the system's temporary folder).
        timeout_s: how long a receiver waits for the next file before giving up.
    """

    def __init__(
        self,
        bucket_size: int,
        is_master: bool = False,
        root: Optional[str] = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.root = root
        self.timeout_s = timeout_s
        self.folder: Optional[Path] = None
        self.rank = -1
        self.actor_world_size = 0

    def prepare(self) -> dict[str, Any]:
        if self.is_master:
            if self.root:
                Path(self.root).mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="verl-file-weights-", dir=self.root))
            return {"folder": str(self.folder)}
        return {"folder": None}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        folder = metadata[0]["folder"]
        assert folder, "the actor's rank 0 must be the file checkpoint engine's master"
        actor = {
            "rank": list(range(actor_wg_world_size)),
            "folder": [folder] * actor_wg_world_size,
            "actor_world_size": [actor_wg_world_size] * actor_wg_world_size,
        }
        world = actor_wg_world_size + rollout_world_size
        rollout = {
            "rank": list(range(actor_wg_world_size, world)),
            "folder": [folder] * rollout_world_size,
            "actor_world_size": [actor_wg_world_size] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, folder: str, actor_world_size: int) -> None:
        self.rank = rank
        self.folder = Path(folder)
        self.actor_world_size = actor_world_size

    def finalize(self) -> None:
        if self.is_master and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None
        self.rank = -1

    @torch.no_grad()
    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: Optional[int] = None
    ) -> dict[str, Any]:
        assert 0 <= self.rank < self.actor_world_size, "only the actor's workers send weights"
        if self.rank != 0:
            for _ in weights:  # each full tensor is gathered collectively: take part
                pass
            return {}
        folder = self._folder()
        started = time.monotonic()
        bucket: list[tuple[str, torch.Tensor]] = []
        size = written = count = 0
        for name, weight in weights:
            # A full copy on the CPU: torch.save of a view would write its whole storage.
            tensor = weight.detach().to("cpu", copy=True).contiguous()
            if bucket and size + tensor.nbytes > self.bucket_size:
                _save(_bucket(folder, count), bucket)
                count, bucket, size = count + 1, [], 0
                await asyncio.sleep(0)
            bucket.append((name, tensor))
            size += tensor.nbytes
            written += tensor.nbytes
        if bucket:
            _save(_bucket(folder, count), bucket)
            count += 1
        done = {"buckets": count, "global_steps": global_steps}
        _write(folder / _DONE, json.dumps(done).encode())
        return {
            "file_checkpoint_engine/megabytes": written / 2**20,
            "file_checkpoint_engine/send_s": time.monotonic() - started,
        }

    async def receive_weights(
        self, global_steps: Optional[int] = None
    ) -> AsyncIterator[tuple[str, torch.Tensor]]:
        assert self.rank >= self.actor_world_size, "only the rollout's workers receive weights"
        folder = self._folder()
        index, total = 0, None
        deadline = time.monotonic() + self.timeout_s
        while total is None or index < total:
            path = _bucket(folder, index)
            if path.is_file():
                for name, tensor in torch.load(path, weights_only=True):
                    yield name, tensor
                index += 1
                deadline = time.monotonic() + self.timeout_s
                continue
            if total is None and (folder / _DONE).is_file():
                with contextlib.suppress(ValueError):
                    total = int(json.loads((folder / _DONE).read_text())["buckets"])
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no weights bucket {index} in {folder} after {self.timeout_s:.0f} s"
                )
            await asyncio.sleep(_POLL_S)

    def _folder(self) -> Path:
        assert self.folder is not None, "init_process_group was not called for this sync"
        return self.folder
