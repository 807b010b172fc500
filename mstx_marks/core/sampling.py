"""Sampling policies: which calls of a hot target get a range.

A decode loop that runs thousands of steps should not produce thousands of ranges. A policy says
which calls of one decorated or instrumented target are marked, by their 0-based call index:

>>> every(10).indices(25)
[0, 10, 20]
>>> window(30, 70).indices(200) == list(range(30, 70))
True
>>> (every(2) & window(3, 9)).indices(20)
[4, 6, 8]

Each target gets its own :meth:`Policy.decisions` stream, an iterator of booleans built only from
``itertools`` pieces, so the per-call decision is one C-level ``next()``: a sampled-out call costs
about what a disabled range costs, and concurrent threads never see the same index twice.
"""

from __future__ import annotations

import itertools
import operator
import re
import sys
from typing import Any, Callable, Iterable, Iterator, SupportsIndex

from mstx_marks.base.checks import check_int

__all__ = ["Decisions", "Policy", "every", "first", "parse_policy", "window"]

# every(n) up to this period cycles a precomputed pattern: the fastest decision, in <= 64 KB.
_CYCLE_MAX = 4096


class Decisions(itertools.chain):  # type: ignore[type-arg]
    """One target's stream of keep/skip booleans; pickles as a fresh stream of its policy."""

    policy: Policy

    def __reduce__(self) -> tuple[Callable[[], Decisions], tuple[()]]:
        return (self.policy.decisions, ())


class Policy:
    """A set of call indices, described lazily. Combine with ``&`` (both) and ``|`` (either)."""

    __slots__ = ("_make", "_rebuild", "_text")

    # ``make`` returns the segments of the stream; one chain over them, not a chain of chains,
    # keeps each decision a single C-level hop.
    def __init__(
        self,
        make: Callable[[], tuple[Iterable[bool], ...]],
        text: str,
        rebuild: tuple[Callable[..., Policy], tuple[Any, ...]] | None = None,
    ) -> None:
        self._make = make
        self._text = text
        # ``make`` is a closure, which plain pickle refuses; a policy travels as the call that
        # built it, so marks and decorated functions with ``sample=`` pickle for multiprocessing.
        self._rebuild = rebuild

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        if self._rebuild is not None:
            return self._rebuild
        return super().__reduce_ex__(protocol)

    def decisions(self) -> Decisions:
        """A fresh per-target stream: the i-th ``next()`` says whether call i is marked."""
        stream = Decisions(*self._make())
        stream.policy = self
        return stream

    def indices(self, calls: int) -> list[int]:
        """The indices among the first ``calls`` calls that this policy marks."""
        return [i for i, keep in zip(range(calls), self._stream()) if keep]

    def _stream(self) -> Iterator[bool]:
        return itertools.chain(*self._make())

    def __and__(self, other: Policy) -> Policy:
        return _combine(operator.and_, self, other, "&")

    def __or__(self, other: Policy) -> Policy:
        return _combine(operator.or_, self, other, "|")

    def __repr__(self) -> str:
        return self._text


def _combine(op: Callable[[bool, bool], bool], a: Policy, b: Policy, sym: str) -> Policy:
    if not isinstance(b, Policy):
        raise TypeError(f"cannot combine a sampling policy with {b!r}")
    return Policy(
        lambda: (map(op, a._stream(), b._stream()),),
        f"({a!r} {sym} {b!r})",
        (_combine, (op, a, b, sym)),
    )


_EVERY: dict[int, Policy] = {}
_MAX_EVERY = 1024


def every(n: int) -> Policy:
    """Mark calls 0, n, 2n, ...

    >>> every(0)
    Traceback (most recent call last):
    ...
    ValueError: every(n): n must be >= 1, got 0
    """
    n = check_int(n, "every(n): n", 1, sys.maxsize)
    # Policies are immutable: one object per n, so `mark(name, sample=every(10))` written at
    # each use costs a dict lookup rather than building a policy.
    found = _EVERY.get(n)
    if found is not None:
        return found
    make: Callable[[], tuple[Iterable[bool], ...]]
    if n <= _CYCLE_MAX:
        pattern = (True,) + (False,) * (n - 1)

        def make() -> tuple[Iterable[bool], ...]:
            return (itertools.cycle(pattern),)
    else:
        # A cycled pattern holds n items (8 GB for every(10**9)); counting positions within each
        # period from a reiterable range holds none, for about 15 ns more per decision.
        def make() -> tuple[Iterable[bool], ...]:
            positions = itertools.chain.from_iterable(itertools.repeat(range(n)))
            return (map(operator.not_, positions),)

    policy = Policy(make, f"every({n})", (every, (n,)))
    if len(_EVERY) < _MAX_EVERY:
        _EVERY[n] = policy
    return policy


def first(k: int) -> Policy:
    """Mark the first ``k`` calls only.

    >>> first(2).indices(5)
    [0, 1]
    """
    k = check_int(k, "first(k): k", 0, sys.maxsize)
    return Policy(
        lambda: (itertools.repeat(True, k), itertools.repeat(False)),
        f"first({k})",
        (first, (k,)),
    )


def window(start: int, stop: int) -> Policy:
    """Mark calls ``start <= i < stop`` (the meaning of verl's profile_token_start/end).

    >>> window(5, 5)
    Traceback (most recent call last):
    ...
    ValueError: window(start, stop): stop must be > start, got start=5, stop=5
    """
    start = check_int(start, "window(start, stop): start", 0, sys.maxsize)
    stop = check_int(stop, "window(start, stop): stop", 0, sys.maxsize)
    if stop <= start:
        raise ValueError(
            f"window(start, stop): stop must be > start, got start={start}, stop={stop}"
        )
    return Policy(
        lambda: (
            itertools.repeat(False, start),
            itertools.repeat(True, stop - start),
            itertools.repeat(False),
        ),
        f"window({start}, {stop})",
        (window, (start, stop)),
    )


_POLICIES: dict[str, tuple[Callable[..., Policy], int]] = {
    "every": (every, 1),
    "first": (first, 1),
    "window": (window, 2),
}
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(\S))")


#: Parentheses deeper than this are refused: a policy needs a few levels, and an unbounded
#: recursive descent would turn a hostile MSTX_MARKS_SAMPLE into a RecursionError.
MAX_DEPTH = 32


def parse_policy(text: str) -> Policy:
    """A policy written as in Python (``every(10) & window(30, 70) | first(1)``), read without
    ``eval``: ``&`` binds tighter than ``|``, parentheses group. Raises ValueError naming the
    text and the rule.

    >>> parse_policy("every(2) & window(3, 9)").indices(20)
    [4, 6, 8]
    >>> parse_policy("every(x)")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: sampling policy 'every(x)': expected a number at 'x'; write every(N), ...
    """
    return _Parser(text).parse()


class _Parser:
    """Recursive descent over the tokens of one policy text. Not thread-safe (one per text)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:  # only blanks remain
                break
            self.tokens.append(m.group(0).strip())
            pos = m.end()
        self.at = 0
        self.depth = 0

    def parse(self) -> Policy:
        if not self.tokens:
            raise self.fail("it is empty")
        result = self.expr()
        if self.at != len(self.tokens):
            raise self.fail(f"unexpected {self.tokens[self.at]!r}")
        return result

    def fail(self, why: str) -> ValueError:
        shown = self.text if len(self.text) <= 80 else self.text[:77] + "..."
        return ValueError(
            f"sampling policy {shown!r}: {why}; write every(N), first(K), window(START, STOP),"
            " combined with & and |"
        )

    def peek(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if expected is not None and token != expected:
            raise self.fail(f"expected {expected!r} at {token or 'the end'!r}")
        if not token:
            raise self.fail("unexpected end")
        self.at += 1
        return token

    def expr(self) -> Policy:
        policy = self.term()
        while self.peek() == "|":
            self.take()
            policy = policy | self.term()
        return policy

    def term(self) -> Policy:
        policy = self.factor()
        while self.peek() == "&":
            self.take()
            policy = policy & self.factor()
        return policy

    def factor(self) -> Policy:
        token = self.take()
        if token == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.fail(f"parentheses nest deeper than {MAX_DEPTH}")
            inner = self.expr()
            self.take(")")
            self.depth -= 1
            return inner
        if token not in _POLICIES:
            raise self.fail(f"unknown policy {token!r}")
        build, arity = _POLICIES[token]
        self.take("(")
        args = []
        for i in range(arity):
            if i:
                self.take(",")
            number = self.take()
            if not (number.isascii() and number.isdigit()):
                raise self.fail(f"expected a number at {number!r}")
            args.append(int(number))
        self.take(")")
        try:
            return build(*args)
        except (TypeError, ValueError) as exc:
            raise self.fail(str(exc)) from None
