"""Property tests: random programs of nested ranges, run against the record backend and against the
mstx backend over the fake C layer (a collector active, so real ids come back).

A program is a tree. Each range node has a unique name and a domain; it is a ``with mark``, a
decorated function, coroutine, generator or async generator, may raise, and runs its children in
its body. ``threads`` and ``tasks`` nodes run their children concurrently (threads, or asyncio
tasks that await inside their ranges); ``shared`` nodes enter one mark object used everywhere.
The program logs when each body starts and ends, and the checks compare that with the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.isolation import fresh
from support.threads import run_threads
from support.torch_npu_double import install_double

import mstx_marks
from mstx_marks import configure, mark, mstx_range

DOMAINS = ["default", "verl", "vllm_x"]
RANGE_KINDS = ["with", "sync", "coro", "gen", "agen", "shared"]
SHARED_NAME = "shared_mark"


@dataclass
class Node:
    kind: str
    domain: str = "default"
    raises: bool = False
    close_early: bool = False
    children: list[Node] = field(default_factory=list)
    name: str = ""


class Boom(Exception):
    def __init__(self, node: Node) -> None:
        super().__init__(node.name)
        self.node = node


def _range_node(children: st.SearchStrategy[list[Node]]) -> st.SearchStrategy[Node]:
    return st.builds(
        Node,
        kind=st.sampled_from(RANGE_KINDS),
        domain=st.sampled_from(DOMAINS),
        raises=st.booleans(),
        close_early=st.booleans(),
        children=children,
    )


def _tree(leaves: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    def extend(inner: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        kids = st.lists(inner, max_size=3)
        return st.one_of(
            _range_node(kids),
            st.builds(Node, kind=st.sampled_from(["threads", "tasks"]), children=kids),
        )

    return st.recursive(leaves, extend, max_leaves=12)


PROGRAMS = st.lists(_tree(_range_node(st.just([]))), min_size=1, max_size=3)


class Program:
    """Builds the marks and decorated callables once, then runs the tree and logs bodies."""

    def __init__(self, roots: list[Node], clock: Callable[[], int]) -> None:
        self.roots = roots
        self.clock = clock
        self.bodies: list[tuple[str, str, int, int]] = []  # name, domain, start, end
        self.shared = mark(SHARED_NAME, domain="verl")
        self.shared_entries = 0
        self._lock = threading.Lock()
        counter = itertools.count()
        self.sites: dict[int, Any] = {}
        for node in self._walk(roots):
            node.name = f"n{next(counter)}_{node.kind}"
            if node.kind in RANGE_KINDS and node.kind != "shared":
                self.sites[id(node)] = self._site(node)

    def _walk(self, nodes: list[Node]) -> list[Node]:
        out = []
        for n in nodes:
            out.append(n)
            out += self._walk(n.children)
        return out

    def range_nodes(self) -> list[Node]:
        return [n for n in self._walk(self.roots) if n.kind in RANGE_KINDS and n.kind != "shared"]

    # --- bodies --------------------------------------------------------------------------------

    def _log(self, node: Node, start: int) -> None:
        with self._lock:
            self.bodies.append((node.name, node.domain, start, self.clock()))

    def _children(self, node: Node) -> None:
        for child in node.children:
            try:
                self.run(child)
            except Boom as exc:
                assert exc.node is child

    async def _achildren(self, node: Node) -> None:
        for child in node.children:
            try:
                await self.arun(child)
            except Boom as exc:
                assert exc.node is child

    def _finish(self, node: Node) -> None:
        if node.raises:
            raise Boom(node)

    def _site(self, node: Node) -> Any:
        deco = mstx_range(node.name, domain=node.domain)
        if node.kind == "with":
            return mark(node.name, domain=node.domain)
        if node.kind == "sync":

            def sync() -> None:
                start = self.clock()
                try:
                    self._children(node)
                finally:
                    self._log(node, start)
                self._finish(node)

            return deco(sync)
        if node.kind == "coro":

            async def coro() -> None:
                start = self.clock()
                try:
                    await asyncio.sleep(0)
                    await self._achildren(node)
                finally:
                    self._log(node, start)
                self._finish(node)

            return deco(coro)
        if node.kind == "gen":

            def gen() -> Any:
                start = self.clock()
                try:
                    yield 1
                    self._children(node)
                    yield 2
                finally:
                    self._log(node, start)
                self._finish(node)

            return deco(gen)

        async def agen() -> Any:
            start = self.clock()
            try:
                yield 1
                await asyncio.sleep(0)
                await self._achildren(node)
                yield 2
            finally:
                self._log(node, start)
            self._finish(node)

        return deco(agen)

    # --- sync execution --------------------------------------------------------------------------

    def run(self, node: Node) -> None:
        site = self.sites.get(id(node))
        kind = node.kind
        if kind == "with":
            with site:
                start = self.clock()
                try:
                    self._children(node)
                finally:
                    self._log(node, start)
                self._finish(node)
        elif kind == "shared":
            with self.shared:
                with self._lock:
                    self.shared_entries += 1
                self._children(node)
        elif kind == "sync":
            site()
        elif kind == "gen":
            g = site()
            next(g)
            if node.close_early:
                g.close()
            else:
                for _ in g:
                    pass
        elif kind == "threads":
            errors: list[BaseException] = []

            def target(child: Node) -> None:
                try:
                    self.run(child)
                except Boom:
                    pass
                except BaseException as exc:
                    errors.append(exc)

            run_threads(target, [(c,) for c in node.children])
            assert not errors, errors
        else:  # coro, agen, tasks: an event loop of their own
            _run_async(lambda: self.arun(node))

    # --- async execution -------------------------------------------------------------------------

    async def arun(self, node: Node) -> None:
        site = self.sites.get(id(node))
        kind = node.kind
        if kind == "with":
            with site:
                start = self.clock()
                try:
                    await asyncio.sleep(0)
                    await self._achildren(node)
                finally:
                    self._log(node, start)
                self._finish(node)
        elif kind == "shared":
            with self.shared:
                with self._lock:
                    self.shared_entries += 1
                await asyncio.sleep(0)
                await self._achildren(node)
        elif kind == "coro":
            await site()
        elif kind == "agen":
            ag = site()
            await ag.__anext__()
            if node.close_early:
                await ag.aclose()
            else:
                async for _ in ag:
                    pass
        elif kind == "tasks":

            async def child_task(child: Node) -> None:
                with contextlib.suppress(Boom):
                    await self.arun(child)

            await asyncio.gather(*(child_task(c) for c in node.children))
        else:  # sync, gen, threads run as they would in sync code
            self.run(node)


def _run_async(factory: Callable[[], Any]) -> None:
    """asyncio.run, or in a helper thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(factory())
        return
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(factory())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def _execute(program: Program) -> None:
    for root in program.roots:
        try:
            program.run(root)
        except Boom as exc:
            assert exc.node is root


@dataclass
class Seen:
    """A range as the backend saw it."""

    name: str
    domain: str
    start: int
    end: Optional[int]


def _check(program: Program, seen: list[Seen]) -> None:
    by_name: dict[str, list[Seen]] = {}
    for s in seen:
        by_name.setdefault(s.name, []).append(s)
    # every started range ended, exactly once per run of its body, in its own domain
    assert all(s.end is not None for s in seen), [s for s in seen if s.end is None]
    runs = Counter(name for name, _, _, _ in program.bodies)
    for node in program.range_nodes():
        got = by_name.get(node.name, [])
        assert len(got) == runs[node.name], node.name
        assert all(s.domain == node.domain for s in got), (node.name, got)
    # each range contains a run of its own body (a perfect matching; runs are few)
    for name, ranges in by_name.items():
        if name == SHARED_NAME:
            assert len(ranges) == program.shared_entries
            assert {s.domain for s in ranges} == {"verl"}
            continue
        bodies = [(a, b) for n, _, a, b in program.bodies if n == name]
        assert any(
            all(r.start <= a and b <= r.end for r, (a, b) in zip(ranges, perm))  # type: ignore[operator]
            for perm in itertools.permutations(bodies)
        ), (name, ranges, bodies)
    assert len(seen) == sum(runs.values()) + program.shared_entries


_fresh = fresh


COMMON = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@COMMON
@given(PROGRAMS)
def test_random_programs_on_the_record_backend(roots: list[Node]) -> None:
    _fresh()
    rec = mstx_marks.Recorder()
    configure(backend=rec)
    program = Program(roots, time.time_ns)
    _execute(program)
    records = rec.records()
    assert all(r.kind == "range" for r in records)
    _check(program, [Seen(r.name, r.domain, r.start_ns, r.end_ns) for r in records])
    _fresh()


@COMMON
@given(PROGRAMS)
def test_random_programs_on_the_mstx_backend(roots: list[Node]) -> None:
    _fresh()
    with install_double(npu_available=True) as env:
        configure(backend="mstx")
        program = Program(roots, time.monotonic_ns)
        with env.collect() as col:
            _execute(program)
        col.assert_clean()  # no open range, no double/unknown end, no domain mismatch
        ends = Counter(c[1] for c in col.calls if c[0] == "range_end")
        assert ends == Counter(r.range_id for r in col.ranges)
        _check(program, [Seen(r.message, r.domain, r.start_ns, r.end_ns) for r in col.ranges])
    _fresh()


@COMMON
@given(
    st.lists(
        st.tuples(st.sampled_from(DOMAINS), st.integers(0, 4), st.booleans()),
        min_size=1,
        max_size=12,
    )
)
def test_gathered_tasks_sharing_marks_pair_correctly(
    specs: list[tuple[str, int, bool]],
) -> None:
    """Tasks entering the SAME mark objects, awaiting inside them, finishing in any order."""
    _fresh()
    with install_double(npu_available=True) as env:
        configure(backend="mstx")
        marks = {d: mark("task_shared", domain=d) for d in DOMAINS}
        bodies: list[tuple[str, int, int]] = []

        async def task(domain: str, sleeps: int, fail: bool) -> None:
            with marks[domain]:
                a = time.monotonic_ns()
                for _ in range(sleeps):
                    await asyncio.sleep(0)
                bodies.append((domain, a, time.monotonic_ns()))
                if fail:
                    raise ValueError(domain)

        async def main() -> list[Any]:
            return await asyncio.gather(*(task(*s) for s in specs), return_exceptions=True)

        with env.collect() as col:
            results = asyncio.run(main())
        assert [isinstance(r, ValueError) for r in results] == [f for _, _, f in specs]
        col.assert_clean()
        assert Counter(r.domain for r in col.ranges) == Counter(d for d, _, _ in specs)
        for domain, a, b in bodies:
            assert any(
                r.domain == domain and r.start_ns <= a and b <= r.end_ns  # type: ignore[operator]
                for r in col.ranges
            )
    _fresh()
