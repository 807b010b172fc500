"""The summary of traces that lie on the nodes of a Ray cluster, each node's read on that node:
``mstx-marks summary DIR --ray ADDRESS`` (and ``coverage``).

A multi-node job writes every process's files (``MSTX_MARKS_OUT``: ``spill/``, ``chrome/``,
``ascend/``) to its node's own disk. :class:`RayReader` is the summary's
:class:`~mstx_marks.analysis.summary.PartReader` for them: it connects to the cluster, and a task
pinned to each alive node (``NodeAffinitySchedulingStrategy(node, soft=False)``) runs
:func:`~mstx_marks.analysis.summary.read_files` on that node's disk, which reduces each file to
its :class:`~mstx_marks.analysis.model.aggregate.ProcessPart` (a few numbers per phase and process,
no
record) as a local summary does; only those come back. The caller then does what it does for a
local folder (picks the run and one copy of each process, combines): the summary printed is the
one of the nodes' folders copied together, and whatever a part holds travels the same way.

A member (role and rank) whose processes are in several files is read again, its files
together, on a node that holds them all (:func:`~mstx_marks.analysis.summary.read_members`).
When they lie on several nodes (a rank 0 of one role on each node), each node aggregates its own
in one pass (:func:`~mstx_marks.analysis.summary.member_streams`) and the caller sums them: its
counts, totals and steps are exact, its self times not known, as for a spill too large to hold
(a note says which member and why).

**Paths.** ``DIR`` is read on every node after replacing ``{node_id}``, ``{node_ip}`` and
``{host}`` (:data:`PLACEHOLDERS`) with that node's Ray id, IP and host name: a job that wrote
``/data/prof/$HOSTNAME`` is read with ``summary /data/prof/{host} --ray auto``. A node without
the folder is named in a note (the head often runs no rank); no node with it is an error. A
relative ``DIR`` is taken from this process's folder. A file seen at the same path by several
nodes (a shared filesystem) is used once.

**Nodes.** The nodes the cluster knows, from Ray's state API (``ray.util.state.list_nodes``,
served by the dashboard of ``ray[default]``), else from the GCS's own table (``ray.nodes()``)
when no dashboard runs. A note says how many nodes were read; a dead node, or one whose task
failed, is an error naming it (exit status 1; the others are still summarised).

Ray is imported only when a reader is made (:class:`ClusterError` when it is missing or the
cluster cannot be reached); every node needs mstx_marks importable, at the caller's version.

>>> node_path("/data/prof/{host}/{node_ip}", "3f2a9c1e77", "10.0.0.2", "gpu-3")
'/data/prof/gpu-3/10.0.0.2'
"""

from __future__ import annotations

import importlib
import logging
import pickle
import socket
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Mapping, Sequence

from mstx_marks.analysis.model.steps import StepOptions
from mstx_marks.analysis.readers.stream import StreamAggregator
from mstx_marks.analysis.summary import (
    FilesRead,
    MemberFiles,
    Reading,
    member_streams,
    read_files,
    read_members,
    streamed_member,
)
from mstx_marks.base import VERSION
from mstx_marks.base.records import Member, RankTrace

__all__ = [
    "PLACEHOLDERS",
    "ClusterError",
    "Node",
    "NodeRead",
    "RayReader",
    "node_path",
    "nodes_of_state",
    "nodes_of_table",
]

#: What a path given to ``--ray`` may hold, replaced on each node by its own.
PLACEHOLDERS = ("{node_id}", "{node_ip}", "{host}")
#: The most rows the state API returns at once (its server's own cap, 10,000 by default).
_STATE_LIMIT = 10_000
_DEAD = "dead"

# What a node sends back for the members read again: its id, each whole member's reading, and
# for each member's files there, their aggregators (or why they could not be read).
_Again = tuple[str, list[Reading], list["list[tuple[RankTrace, StreamAggregator]] | str"]]


class ClusterError(Exception):
    """Ray is not installed, or the cluster cannot be reached: ``--ray`` says so (status 2)."""


def node_path(template: str, node_id: str, node_ip: str, host: str) -> str:
    """``template`` with :data:`PLACEHOLDERS` replaced by one node's id, IP and host name (other
    braces are left as they are)."""
    return (
        template.replace("{node_id}", node_id).replace("{node_ip}", node_ip).replace("{host}", host)
    )


@dataclass(frozen=True)
class Node:
    """A node of the cluster: its Ray id (hex), its IP, whether it is alive, and the CPUs Ray
    counts there (None: not said), which its task reads with (as ``--jobs`` does here)."""

    node_id: str
    ip: str
    alive: bool
    cpus: int | None = None

    @property
    def label(self) -> str:
        """``10.0.0.2 (3f2a9c1e)``: its IP and the start of its id (``ray list nodes`` shows
        the whole)."""
        return f"{self.ip or '?'} ({self.node_id[:8]})"


def nodes_of_state(listed: Iterable[Any]) -> list[Node]:
    """The nodes of ``ray.util.state.list_nodes()``'s rows.

    >>> from types import SimpleNamespace as Row
    >>> nodes = nodes_of_state([
    ...     Row(node_id="ab12", node_ip="10.0.0.2", state="ALIVE", resources_total={"CPU": 8.0}),
    ...     Row(node_id="cd34", node_ip="10.0.0.3", state="DEAD", resources_total={})])
    >>> [(n.label, n.alive, n.cpus) for n in nodes]
    [('10.0.0.2 (ab12)', True, 8), ('10.0.0.3 (cd34)', False, None)]
    """
    return [
        Node(
            str(n.node_id),
            str(n.node_ip or ""),
            n.state == "ALIVE",
            _cpus(getattr(n, "resources_total", None)),
        )
        for n in listed
    ]


def nodes_of_table(table: Iterable[Mapping[str, Any]]) -> list[Node]:
    """The nodes of ``ray.nodes()``'s table.

    >>> nodes_of_table([{"NodeID": "ab12", "NodeManagerAddress": "10.0.0.2", "Alive": True,
    ...                  "Resources": {"CPU": 4.0, "memory": 1e9}}])
    [Node(node_id='ab12', ip='10.0.0.2', alive=True, cpus=4)]
    """
    return [
        Node(
            str(n["NodeID"]),
            str(n.get("NodeManagerAddress") or ""),
            bool(n.get("Alive")),
            _cpus(n.get("Resources")),
        )
        for n in table
    ]


def _cpus(resources: Any) -> int | None:
    """The CPUs of a node's resources (``{"CPU": 8.0, ...}``), at least one; None when not
    said."""
    cpu = resources.get("CPU") if isinstance(resources, Mapping) else None
    return max(int(cpu), 1) if isinstance(cpu, (int, float)) else None


@dataclass
class NodeRead:
    """One node as the summary read it: the folder its task read there, the node id the task
    saw from inside, whether the folder exists there, the trace files found, the bytes of parts
    sent back (pickled), and why it was not read (empty when it was)."""

    node: Node
    path: str = ""
    ran_on: str = ""
    found: bool = False
    files: int = 0
    sent_bytes: int = 0
    error: str = ""


@dataclass
class _Sent:
    """What a node's task sends back: where it ran and what it read there."""

    node_id: str
    path: str
    found: bool
    version: str
    read: FilesRead


def _here(template: str) -> tuple[str, str]:
    """The id of the node this task runs on, and ``template`` made its path."""
    ray = importlib.import_module("ray")
    node_id = str(ray.get_runtime_context().get_node_id())
    ip = str(ray.util.get_node_ip_address())
    return node_id, node_path(template, node_id, ip, socket.gethostname())


def _read_node(template: str, steps: StepOptions, jobs: int | None, cpus: int | None) -> _Sent:
    """A task on one node: its folder's trace files, each reduced to its parts there."""
    node_id, path = _here(template)
    root = Path(path)
    read = read_files(root, steps, jobs, progress=False, cpus=cpus)
    return _Sent(node_id, path, root.exists(), VERSION, read)


def _read_again(
    whole: list[MemberFiles], pieces: list[MemberFiles], jobs: int | None, cpus: int | None
) -> _Again:
    """A task on one node: the members whose files are all there, read again together; and
    for the members whose files are on several nodes, an aggregator of each of their files
    there."""
    node_id = str(importlib.import_module("ray").get_runtime_context().get_node_id())
    streams: list[list[tuple[RankTrace, StreamAggregator]] | str] = []
    for member, files, steps in pieces:
        try:
            streams.append(member_streams(member, files, steps))
        except Exception as e:  # named with its member; the other members are still read
            streams.append(f"{type(e).__name__}: {e}")
    return node_id, read_members(whole, jobs, cpus) if whole else [], streams


def _why(e: BaseException) -> str:
    """A task's failure in one line: the error raised inside it, else Ray's own."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    text = str(e).split(" lease_id=")[0].strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MB"


class RayReader:
    """Reads a summary's files on the nodes of a Ray cluster (see the module's docstring):
    pass it as ``reader`` to :func:`~mstx_marks.analysis.summary.summarize_path` or
    :func:`~mstx_marks.analysis.summary.run_summary`. Connects at once (to ``address``, as
    ``ray.init`` takes it: ``auto``, ``HOST:PORT``) unless this process is connected already;
    ``close()`` (or leaving a ``with``) disconnects what it connected. ``nodes`` reads those
    node ids only (default: every node). After a read, :attr:`nodes` says what each node did.

    .. code-block:: python

        with RayReader("auto") as reader:  # a driver of the cluster the job ran on
            summary = summarize_path("/data/prof/{host}", reader=reader)
    """

    def __init__(self, address: str = "auto", nodes: Sequence[str] | None = None) -> None:
        try:
            self._ray: Any = importlib.import_module("ray")
        except ImportError as e:
            raise ClusterError(
                f"--ray needs Ray in this Python, at the cluster's version (pip install"
                f" 'ray[default]'): {e}"
            ) from e
        self.address = address
        self._owned = False
        self._dashboard = False
        if not self._ray.is_initialized():
            try:
                context = self._ray.init(
                    address=address, log_to_driver=False, logging_level=logging.WARNING
                )
            except Exception as e:
                raise ClusterError(
                    f"--ray {address}: cannot connect to a Ray cluster there ({_why(e)})"
                ) from e
            self._owned = True
            self._dashboard = bool(getattr(context, "dashboard_url", ""))
        self._only = list(nodes) if nodes is not None else None
        #: What each node did in the last read.
        self.nodes: list[NodeRead] = []
        self._holders: dict[Path, list[str]] = {}  # each file found: the nodes that have it
        self._remotes: dict[Any, Any] = {}

    def __enter__(self) -> RayReader:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect from the cluster, when this reader connected."""
        if self._owned:
            self._ray.shutdown()
            self._owned = False

    def cluster_nodes(self) -> list[Node]:
        """Every node the cluster knows, alive or dead (see the module's docstring)."""
        if self._dashboard:
            try:
                state = importlib.import_module("ray.util.state")
                rows = state.list_nodes(limit=_STATE_LIMIT, raise_on_missing_output=False)
                return nodes_of_state(rows)
            except Exception:  # the dashboard went away: the GCS's table says the same
                pass
        return nodes_of_table(self._ray.nodes())

    def _chosen(self) -> list[Node]:
        known = self.cluster_nodes()
        if self._only is None:
            return known
        by_id = {n.node_id: n for n in known}
        # An id the cluster does not know is still tried: Ray's refusal names it.
        return [by_id.get(i, Node(i, "", True)) for i in self._only]

    def _task(self, fn: Any, node_id: str) -> Any:
        """``fn`` as a Ray task pinned to the node ``node_id`` (exported to the cluster once)."""
        remote = self._remotes.get(fn)
        if remote is None:
            # No CPU asked: the read must not wait behind a job that holds every CPU there.
            remote = self._remotes[fn] = self._ray.remote(num_cpus=0, max_retries=0)(fn)
        strategies = importlib.import_module("ray.util.scheduling_strategies")
        where = strategies.NodeAffinitySchedulingStrategy(node_id, soft=False)
        return remote.options(scheduling_strategy=where)

    def files(self, root: Path, steps: StepOptions, jobs: int | None, progress: bool) -> FilesRead:
        """Each alive node's trace files under ``root`` (its placeholders replaced there), each
        reduced to its parts on its node; ``progress`` is not shown (the nodes read at once)."""
        del progress
        # The same absolute path on every node (a task's working folder is Ray's, not ours).
        root = root if root.is_absolute() else Path.cwd() / root
        self.nodes = [NodeRead(n) for n in self._chosen()]
        self._holders = {}
        pending = []
        for read in self.nodes:
            if not read.node.alive:
                read.error = _DEAD
                continue
            try:
                task = self._task(_read_node, read.node.node_id)
            except ValueError as e:  # an id Ray refuses (not hex, or nil)
                read.error = f"not a node ({e})"
                continue
            pending.append((read, task.remote(str(root), steps, jobs, read.node.cpus)))
        results: list[tuple[Path, Reading]] = []
        errors: list[str] = []
        notes: list[str] = []
        for read, ref in pending:
            try:
                sent: _Sent = self._ray.get(ref)
            except Exception as e:
                read.error = f"its task failed ({_why(e)})"
                continue
            read.ran_on, read.path, read.found = sent.node_id, sent.path, sent.found
            read.files = len(sent.read.results)
            read.sent_bytes = len(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL))
            if sent.version != VERSION:
                notes.append(
                    f"Ray node {read.node.label} runs mstx_marks {sent.version}, this process"
                    f" {VERSION}: install one version everywhere if its figures look wrong"
                )
            for file, reading in sent.read.results:
                holders = self._holders.setdefault(file, [])
                holders.append(read.node.node_id)
                if len(holders) == 1:  # a shared filesystem's file: used once
                    results.append((file, reading))
            if sent.found:
                errors.extend(sent.read.errors)
        dead = [r.node.label for r in self.nodes if r.error == _DEAD]
        if dead:  # one line however many (an autoscaled cluster lists those it let go)
            errors.append(f"{len(dead)} Ray node(s) dead, their traces not read: {', '.join(dead)}")
        errors += [
            f"Ray node {r.node.label}: {r.error}" for r in self.nodes if r.error not in ("", _DEAD)
        ]
        errors += self._missing(root, notes)
        return FilesRead(results, errors, [self.report(root), *notes, *self._shared()])

    def _missing(self, root: Path, notes: list[str]) -> list[str]:
        """The nodes read that have no such folder: a note, or an error when none has it."""
        read = [r for r in self.nodes if not r.error]
        missing = [r for r in read if not r.found]
        if not missing:
            return []
        if len(missing) == len(read):
            return [f"{root}: no such file or folder on any of the {len(read)} nodes read"]
        labels = ", ".join(f"{r.node.label}: {r.path}" for r in missing)
        notes.append(f"no such folder on {len(missing)} node(s), nothing read there: {labels}")
        return []

    def _shared(self) -> list[str]:
        shared = sum(1 for nodes in self._holders.values() if len(nodes) > 1)
        if not shared:
            return []
        return [
            f"{shared} trace file(s) are at the same path on several nodes (a shared"
            " filesystem?): each is used once; such a folder can be summarised without --ray"
        ]

    def report(self, root: Path | str) -> str:
        """How many nodes were read, the files found and the bytes sent back (one line)."""
        read = [r for r in self.nodes if not r.error]
        files = sum(r.files for r in read)
        sent = sum(r.sent_bytes for r in read)
        failed = [r.node.label for r in self.nodes if r.error]
        return (
            f"Ray cluster {self.address}: {root} read on {len(read)} of {len(self.nodes)} nodes"
            f" ({files} trace files; {_kb(sent)} of parts sent back)"
            + (f"; not read: {', '.join(failed)}" if failed else "")
        )

    def members(self, items: Sequence[MemberFiles], jobs: int | None) -> list[Reading]:
        """Each member read again on a node that holds all its files, or, when they lie on
        several, aggregated on each and summed here."""
        out: list[Reading | None] = [None] * len(items)
        whole: dict[str, list[int]] = {}  # node -> the members read there
        pieces: dict[str, list[tuple[int, MemberFiles]]] = {}  # node -> members' files there
        spread: dict[int, list[str]] = {}  # member -> the nodes its files lie on
        for i, (member, files, steps) in enumerate(items):
            holders = [set(self._holders.get(f, ())) for f, _ in files]
            common = set.intersection(*holders) if holders else set()
            if common:
                whole.setdefault(min(common), []).append(i)
                continue
            by_node: dict[str, list[tuple[Path, tuple[frozenset[int], str]]]] = {}
            for f, who in files:
                by_node.setdefault(self._holders[f][0], []).append((f, who))
            for node_id, here in by_node.items():
                pieces.setdefault(node_id, []).append((i, (member, here, steps)))
            spread[i] = sorted(by_node)
        labels = {r.node.node_id: r.node.label for r in self.nodes}
        cpus = {r.node.node_id: r.node.cpus for r in self.nodes}
        pending = []
        for node_id in sorted(set(whole) | set(pieces)):
            mine = [items[i] for i in whole.get(node_id, [])]
            theirs = [p for _, p in pieces.get(node_id, [])]
            task = self._task(_read_again, node_id)
            pending.append((node_id, task.remote(mine, theirs, jobs, cpus.get(node_id))))
        found: dict[int, list[tuple[RankTrace, StreamAggregator]]] = {}
        failed: dict[int, str] = {}
        for node_id, ref in pending:
            where = f"Ray node {labels.get(node_id, node_id[:8])}"
            try:
                _, readings, streams = self._ray.get(ref)
            except Exception as e:
                readings = [
                    (
                        "error",
                        f"{items[i][0].label}: could not be read again on {where} ({_why(e)})",
                    )
                    for i in whole.get(node_id, [])
                ]
                streams = [_why(e)] * len(pieces.get(node_id, []))
            for i, reading in zip(whole.get(node_id, []), readings):
                out[i] = reading
            for (i, _), got in zip(pieces.get(node_id, []), streams):
                if isinstance(got, str):
                    failed[i] = f"on {where}: {got}"
                else:
                    found.setdefault(i, []).extend(got)
        for i, nodes in spread.items():
            named = [labels.get(n, n[:8]) for n in nodes]
            out[i] = _summed(items[i][0], found.get(i, []), failed.get(i), named)
        return [r for r in out if r is not None]


def _summed(
    member: Member,
    found: list[tuple[RankTrace, StreamAggregator]],
    failed: str | None,
    nodes: list[str],
) -> Reading:
    """One member whose files lie on ``nodes``, from each node's aggregators of them."""
    if failed is not None:
        return "error", f"{member.label}: could not be read again ({failed})"
    try:
        found.sort(key=lambda pair: str(pair[0].source))  # as its files are ordered here
        part = streamed_member(member, found)
    except Exception as e:
        return "error", f"{member.label}: could not be read again ({type(e).__name__}: {e})"
    part.notes.append(
        f"{member.label}: its processes' files lie on {len(nodes)} nodes ({', '.join(nodes)}):"
        " each node read its own in one pass, and they were summed here"
    )
    return "ok", [part]
