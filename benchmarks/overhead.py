"""Overhead of marking a range, side by side with the floors and with the other tools.

    python benchmarks/overhead.py            # full run: table on stdout, raw numbers as JSON
    python benchmarks/overhead.py --quick    # a short run (CI keeps the script alive with it)

Every row is timed in each round, in a shuffled order, so drift and noise hit all rows alike;
each figure is the median over rounds of that round's ratio to its reference row. The MSTX rows
run the mstx backend over C-builtin stand-ins for ``torch_npu._C._mstx`` (``operator.is_not``:
two arguments in, a non-zero int out), and torch_npu's own wrappers are the REAL
``torch_npu/npu/mstx.py`` from the torch-npu 2.14.0 wheel over the very same stand-ins.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import operator
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import tracemalloc
import types
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Union

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import mstx_marks  # noqa: E402
from mstx_marks import (  # noqa: E402
    Phase,
    configure,
    current_backend,
    every,
    mark,
    mstx_range,
    window,
)
from mstx_marks.backends.record import Recorder  # noqa: E402
from mstx_marks.core import off  # noqa: E402

time_ns = time.time_ns

STAND_IN = operator.is_not  # a C builtin: f(a, b) -> True (== 1), like _range_start_on_host
C_NAMES = ("_mark", "_mark_on_host", "_range_start", "_range_start_on_host", "_range_end")


def _noop() -> None:
    return None


# The floors are what any generic range tool must do at the least: a wrapper made for one
# function and one name, which passes the start call's handle to the end call.
def _passthrough(func: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def _clocks_floor(func: Any) -> Any:
    """What any in-process recorder must do at the least: a Python call at each end of the
    range, each reading the clock. No store at all: the floor under the record backend."""

    def start(name: str, domain: str) -> int:
        time_ns()
        return 1

    def end(handle: int, domain: str) -> None:
        time_ns()

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        handle = start("x", "default")
        try:
            return func(*args, **kwargs)
        finally:
            end(handle, "default")

    return wrapper


def _try_finally(func: Any, name: str, domain: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        handle = STAND_IN(name, domain)
        try:
            return func(*args, **kwargs)
        finally:
            STAND_IN(handle, domain)

    return wrapper


class _SlotsRange:
    __slots__ = ("domain", "handle", "name")

    def __init__(self, name: str, domain: str = "default") -> None:
        self.name = name
        self.domain = domain

    def __enter__(self) -> _SlotsRange:
        self.handle = STAND_IN(self.name, self.domain)
        return self

    def __exit__(self, *exc: object) -> None:
        STAND_IN(self.handle, self.domain)


def _real_torch_npu(stack: ExitStack) -> Any:
    """torch_npu's real mstx class over the stand-ins, or None when the wheel can't be had."""
    try:
        from support.real_torch_npu import install_real

        env = stack.enter_context(install_real())
    except BaseException as exc:  # pytest's skip is a BaseException
        print(f"(torch_npu anchors unavailable: {exc})", file=sys.stderr)
        return None
    c_module = env.modules["torch_npu._C._mstx"]
    for name in C_NAMES:
        setattr(c_module, name, STAND_IN)
    return env.mstx


#: (statement, reference row[, setup]); the setup picks the settings the row runs under.
Row = Union[tuple[str, str], tuple[str, str, str]]
ON = "configure(enabled=True, backend=fast_path)"
OFF = "configure(enabled=False)"
RECORD = "configure(enabled=True, backend=recorder); recorder.clear()"


def build_rows(stack: ExitStack, number: int) -> tuple[dict[str, Row], dict[str, Any]]:
    """Rows as name -> (statement, reference row); and the namespace the statements run in."""
    npu_mstx = _real_torch_npu(stack)
    if npu_mstx is None:  # still measure our side over a bare stand-in module tree
        fake = types.ModuleType("torch_npu")
        fake._C = types.SimpleNamespace(
            _mstx=types.SimpleNamespace(**dict.fromkeys(C_NAMES, STAND_IN))
        )  # type: ignore[attr-defined]
        fake.npu = types.SimpleNamespace(mstx=None, is_available=lambda: True)  # type: ignore[attr-defined]
        stack.enter_context(_patched_modules({"torch_npu": fake}))
    from mstx_marks.backends.mstx import MstxBackend

    wrapper_path = MstxBackend(wrapper_only=True)  # what the backend falls back to
    # No collector listening: the C start says "not recorded" (0), and the range is held for a
    # profiler that may start before it ends (backends/reopen.py): what that costs.
    no_collector = MstxBackend()
    no_collector._c = no_collector._c_found = types.SimpleNamespace(
        **{**dict.fromkeys(C_NAMES, STAND_IN), "_range_start_on_host": operator.is_}
    )
    configure(backend="mstx", exclude=["filtered"])
    phase = Phase("update_actor")
    ns: dict[str, Any] = {
        "noop": _noop,
        "passthrough": _passthrough(_noop),
        "try_finally": _try_finally(_noop, "x", "default"),
        "SlotsRange": _SlotsRange,
        "mark": mark,
        "PHASE": phase,
        "dec_on": mstx_range("x")(_noop),
        "dec_phase": mstx_range(phase)(_noop),
        "dec_filtered": mstx_range("x", domain="filtered")(_noop),
        "dec_sampled_out": mstx_range("x", sample=window(10**12, 10**12 + 1))(_noop),
        "configure": configure,
        "fast_path": current_backend(),
        "wrapper_path": wrapper_path,
        "no_collector": no_collector,
        "recorder": Recorder(capacity=number + 1),
    }
    rows: dict[str, Row] = {
        "floor: bare call": ("noop()", "floor: bare call"),
        "floor: pass-through wrapper": ("passthrough()", "floor: bare call"),
        "floor: try/finally + 2 C calls": ("try_finally()", "floor: bare call"),
        "floor: __slots__ CM per use": ("with SlotsRange('x'): pass", "floor: bare call"),
        "@mstx_range on": ("dec_on()", "floor: try/finally + 2 C calls"),
        "@mstx_range(PHASE) on": ("dec_phase()", "floor: try/finally + 2 C calls"),
        "@mstx_range filtered": ("dec_filtered()", "floor: pass-through wrapper"),
        "@mstx_range sampled out": ("dec_sampled_out()", "floor: pass-through wrapper"),
        "@mstx_range disabled": ("dec_on()", "floor: pass-through wrapper", OFF),
        "@mstx_range on, public wrapper": (
            "dec_on()",
            "@mstx_range on",
            "configure(enabled=True, backend=wrapper_path)",
        ),
        "@mstx_range on, record": ("dec_on()", "@mstx_range on", RECORD),
        "@mstx_range on, no collector": (
            "dec_on()",
            "@mstx_range on",
            "configure(enabled=True, backend=no_collector)",
        ),
        "with mark('x') on": ("with mark('x'): pass", "floor: __slots__ CM per use"),
        "with mark(PHASE) on": ("with mark(PHASE): pass", "floor: __slots__ CM per use"),
        "with mark('x') disabled": ("with mark('x'): pass", "floor: __slots__ CM per use", OFF),
        "with mark('x') on, record": ("with mark('x'): pass", "with mark('x') on", RECORD),
        "floor: 2 Python calls + 2 clocks": ("clocks_floor()", "@mstx_range on"),
        "@mstx_range on, record / clocks": ("dec_on()", "floor: 2 Python calls + 2 clocks", RECORD),
        "@mstx_range, MSTX_MARKS_OFF": ("dec_off()", "floor: bare call"),
        "with mark('x'), MSTX_MARKS_OFF": (
            "with off_mark('x'): pass",
            "floor: __slots__ CM per use",
        ),
    }
    ns["clocks_floor"] = _clocks_floor(_noop)
    ns["dec_off"] = off.mstx_range("x")(_noop)  # what mstx_range is under MSTX_MARKS_OFF=1
    ns["off_mark"] = off.mark
    if npu_mstx is not None:
        ns["npu_mstx"] = npu_mstx
        ns["npu_annotated"] = npu_mstx.annotate("x")(_noop)
        ns["npu_mstx_range"] = npu_mstx.mstx_range("x")(_noop)
        rows |= {
            "torch_npu @annotate": ("npu_annotated()", "@mstx_range on"),
            "torch_npu @mstx_range": ("npu_mstx_range()", "@mstx_range on"),
            "torch_npu with annotate('x')": (
                "with npu_mstx.annotate('x'): pass",
                "with mark('x') on",
            ),
            "torch_npu range_start/end": (
                "npu_mstx.range_end(npu_mstx.range_start('x'))",
                "with mark('x') on",
            ),
        }
    # Issue 17's rows: a `with` where nothing listens (domain excluded) inside a function, against
    # nvtx's prebuilt annotate with no tool attached; a sampled mark written at each use against
    # a prebuilt one; names by the ten thousand against ten.
    closed, sampled = mark("x", domain="filtered"), mark("x", sample=every(10))
    names_10 = itertools.cycle([f"n{i}" for i in range(10)])
    names_10k = itertools.cycle([f"n{i}" for i in range(10_000)])

    def closed_with() -> None:
        with closed:
            pass

    def sampled_prebuilt() -> None:
        with sampled:
            pass

    def sampled_per_use() -> None:
        with mark("x", sample=every(10)):
            pass

    def few_names() -> None:
        with mark(next(names_10)):
            pass

    def many_names() -> None:
        with mark(next(names_10k)):
            pass

    ns |= {
        "closed_with": closed_with,
        "sampled_prebuilt": sampled_prebuilt,
        "sampled_per_use": sampled_per_use,
        "few_names": few_names,
        "many_names": many_names,
    }
    rows |= {
        "with prebuilt sampled mark": ("sampled_prebuilt()", "floor: bare call"),
        "with mark(x, sample=every(10)) per use": (
            "sampled_per_use()",
            "with prebuilt sampled mark",
        ),
        "with mark(name), 10 names": ("few_names()", "floor: bare call"),
        "with mark(name), 10000 names": ("many_names()", "with mark(name), 10 names"),
    }
    try:
        import nvtx

        ns["nvtx"] = nvtx
        prebuilt_nvtx = nvtx.annotate("x")

        def nvtx_with() -> None:
            with prebuilt_nvtx:
                pass

        ns["nvtx_with"] = nvtx_with
        rows |= {
            "nvtx prebuilt with, in a function": ("nvtx_with()", "floor: bare call"),
            "with m, nothing listens, in a function": (
                "closed_with()",
                "nvtx prebuilt with, in a function",
            ),
        }
        ns["nvtx_annotated"] = nvtx.annotate("x")(_noop)
        rows |= {
            "nvtx @annotate (no tool)": ("nvtx_annotated()", "@mstx_range on"),
            "nvtx with annotate (no tool)": ("with nvtx.annotate('x'): pass", "with mark('x') on"),
        }
    except ImportError:
        pass
    try:
        from torch.profiler import record_function

        ns["record_function"] = record_function
        rows["torch with record_function"] = (
            "with record_function('x'): pass",
            "with mark('x') on",
        )
    except ImportError:
        pass
    try:
        import torch

        from mstx_marks.capture.nn_modules import instrument_modules

        # One hooked module call (pre-hook + forward hook, one Module range) against the same
        # module unhooked: the difference is what instrument_modules costs per module call.
        hooked = torch.nn.Identity()
        stack.callback(instrument_modules(hooked, depth=0).undo)
        # The floor: the same two hooks doing nothing (torch's slow path for hooked modules).
        bare = torch.nn.Identity()
        bare.register_forward_pre_hook(lambda m, a: None, prepend=True)
        bare.register_forward_hook(lambda m, a, o: None, always_call=True)
        ns |= {"plain_module": torch.nn.Identity(), "hooked_module": hooked, "x": torch.zeros(1)}
        ns["noop_hooked_module"] = bare
        rows["module call, no hooks"] = ("plain_module(x)", "floor: bare call")
        rows["module call, 2 no-op hooks"] = ("noop_hooked_module(x)", "module call, no hooks")
        rows["module call, hooked"] = ("hooked_module(x)", "module call, 2 no-op hooks")
    except ImportError:
        pass
    return rows, ns


class _patched_modules:
    def __init__(self, modules: dict[str, Any]) -> None:
        self.modules = modules

    def __enter__(self) -> None:
        self.saved = {k: sys.modules.get(k) for k in self.modules}
        sys.modules.update(self.modules)

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def time_rows(
    rows: dict[str, Row], ns: dict[str, Any], rounds: int, number: int
) -> dict[str, list[float]]:
    """Nanoseconds per call of every row, one figure per round, rows shuffled each round.

    Each row's settings are applied by its setup, before its own timing only.
    """
    timers = {
        name: timeit.Timer(row[0], row[2] if len(row) > 2 else ON, globals=ns)
        for name, row in rows.items()
    }
    out: dict[str, list[float]] = {name: [] for name in rows}
    order = list(rows)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            out[name].append(timers[name].timeit(number) / number * 1e9)
    return out


def ratios(rows: dict[str, Row], ns_per_call: dict[str, list[float]]) -> dict[str, float]:
    """Median over rounds of each row's ratio to its reference row in the same round."""
    return {
        name: statistics.median(a / b for a, b in zip(ns_per_call[name], ns_per_call[ref]))
        for name, (_, ref, *_setup) in rows.items()
    }


def recorder_costs(n: int) -> dict[str, float]:
    """Bytes per recorded range, and the cost per range against nesting depth and name count."""
    rec = Recorder(capacity=n + 1)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    start, end = rec.range_start, rec.range_end
    for _ in range(n):
        end(start("x", "default"), "default")
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    def per_range(depth: int, names: int, total: int) -> float:
        r = Recorder(capacity=total * depth + 10)
        labels = [f"phase_{i}" for i in range(names)]

        def run() -> None:
            for i in range(total):
                label = labels[i % names]
                ids = [start_(label, "default") for _ in range(depth)]
                for rid in reversed(ids):
                    end_(rid, "default")

        start_, end_ = r.range_start, r.range_end
        return min(timeit.repeat(run, number=1, repeat=3)) / (total * depth) * 1e9

    total = max(n // 50, 2000)
    base = per_range(1, 1, total)
    return {
        "bytes_per_range": used / n,
        "ns_per_range_depth1_1name": base,
        "depth32_over_depth1": per_range(32, 1, total // 32 + 1) / base,
        "names10000_over_1name": per_range(1, 10_000, total) / base,
    }


def flush_costs(n: int) -> dict[str, float]:
    """Per event, the time and the peak memory (tracemalloc) beyond the recording itself of
    what a process does at exit: the flight recorder's last spill (which makes everything safe
    on disk), then the export (Chrome trace + Ascend DB, replaced together) streamed from that
    spill, and, side by side, the export as it was before the streaming exporter (the spill
    read whole into memory, then written). Half ranges, half instants."""
    from mstx_marks.export.process_files import export_rank
    from mstx_marks.export.spill import Spill, read_spill
    from mstx_marks.export.stream import export_spill

    names = [f"phase_{i}" for i in range(20)]

    def recorded() -> Recorder:
        # A fresh recording for each measurement: a spill frees what it drained.
        rec = Recorder(capacity=n + 1)
        for i in range(n // 2):
            rec.range_end(rec.range_start(names[i % 20], "verl"), "verl")
            rec.instant("tick", "verl")
        return rec

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        spill = Spill(Path(tmp) / "spilled", recorded(), rank=0).write_now(final=True)
        for what, run in (
            ("spill", lambda rec: Spill(tmp, rec, rank=0).write_now(final=True)),
            ("export", lambda rec: export_spill(tmp, spill, process="bench-1")),
            ("export_in_memory", lambda rec: export_rank(tmp, read_spill(spill), None, "bench-2")),
        ):
            rec = recorded() if what == "spill" else None
            gc.collect()
            started = time.perf_counter()
            run(rec)
            out[f"{what}_us_per_event"] = (time.perf_counter() - started) / n * 1e6
            rec = recorded() if what == "spill" else None
            gc.collect()
            tracemalloc.start()
            run(rec)
            out[f"{what}_peak_bytes_per_event"] = tracemalloc.get_traced_memory()[1] / n
            tracemalloc.stop()
            del rec
    return out


TARGETS = [  # (row, comparison, limit, what the issue asks)
    ("with m, nothing listens, in a function", "<=", 1.1, "no-listener `with m` / nvtx's"),
    ("with mark(x, sample=every(10)) per use", "<=", 1.2, "per-use sampled mark / prebuilt"),
    ("with mark(name), 10000 names", "<=", 1.1, "10,000 names / 10 names"),
    ("@mstx_range on, record / clocks", "<=", 3.0, "recorded @mstx_range / its clocks floor"),
    ("@mstx_range on", "<=", 1.25, "enabled @mstx_range vs the try/finally floor"),
    ("with mark('x') on", "<=", 1.5, "enabled with mark('x') vs the __slots__ floor"),
    ("@mstx_range filtered", "<=", 1.25, "filtered @mstx_range vs pass-through"),
    ("@mstx_range sampled out", "<=", 1.25, "sampled-out @mstx_range vs pass-through"),
    ("@mstx_range disabled", "<=", 1.25, "disabled @mstx_range vs pass-through"),
    ("torch_npu @annotate", ">=", 3.0, "torch_npu @annotate / ours"),
    ("@mstx_range on, record", "<=", 2.0, "recorded @mstx_range vs the mstx one"),
    ("@mstx_range, MSTX_MARKS_OFF", "<=", 1.05, "MSTX_MARKS_OFF @mstx_range vs a bare call"),
]


_FIRST_RANGE = (
    "import time; t0 = time.perf_counter(); import mstx_marks; t1 = time.perf_counter()\n"
    "with mstx_marks.mark('x'):\n    pass\n"
    "import sys; print(t1 - t0, time.perf_counter() - t1, 'torch' in sys.modules,"
    " sorted(m for m in ('argparse', 'sqlite3', 'socket', 'gzip') if m in sys.modules))"
)


def start_up(runs: int) -> dict[str, Any]:
    """In fresh processes: ``import mstx_marks`` against ``import nvtx`` (warm: bytecode cached;
    cold: compiled anew into an empty cache), the first range of a process that has torch
    installed but never imported it, and which heavy modules the import brought in."""

    def seconds(code: str, cold: bool = False) -> list[float]:
        out = []
        for _ in range(runs):
            env = dict(os.environ)
            if cold:
                env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp()
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            out.append(proc.stdout)
        return [float(x.split()[0]) for x in out]

    timed = "import time; t = time.perf_counter(); import {}; print(time.perf_counter() - t)"
    result: dict[str, Any] = {}
    for kind, cold in (("warm", False), ("cold", True)):
        ours = statistics.median(seconds(timed.format("mstx_marks"), cold))
        try:
            theirs = statistics.median(seconds(timed.format("nvtx"), cold))
        except subprocess.CalledProcessError:
            theirs = float("nan")
        result[f"import_{kind}_ms"] = ours * 1e3
        result[f"import_{kind}_over_nvtx"] = ours / theirs
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    lines = [
        subprocess.run(
            [sys.executable, "-c", _FIRST_RANGE], env=env, capture_output=True, text=True,
            check=True,
        ).stdout.split(maxsplit=2)
        for _ in range(runs)
    ]  # fmt: skip
    result["first_range_ms"] = statistics.median(float(line[1]) for line in lines) * 1e3
    result["first_range_imported_torch"] = lines[0][2].startswith("True")
    result["heavy_modules_at_import"] = lines[0][2].split(maxsplit=1)[1].strip()
    return result


def standing(rel: dict[str, float]) -> list[str]:
    """Where we stand against the context managers of torch_npu and nvtx (reported, not targets).

    3x against torch_npu's ``with annotate`` would need a context manager cheaper than the floor
    of any per-use one, since torch_npu's own costs under 3x that floor.
    """
    lines = []
    ours = rel.get("with mark('x') on")
    npu = rel.get("torch_npu with annotate('x')")
    if ours is not None and npu is not None:
        lines.append(
            f"torch_npu with annotate / ours: {npu:.2f}x; torch_npu's is {npu * ours:.2f}x the "
            f"__slots__ floor, so 3x would need ours at {npu * ours / 3:.2f}x that floor"
        )
    for row, what in (
        ("nvtx @annotate (no tool)", "nvtx @annotate"),
        ("nvtx with annotate (no tool)", "nvtx with annotate"),
    ):
        if row in rel:
            lines.append(f"{what} (no tool attached) / ours: {rel[row]:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, small counts")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args(argv)
    rounds, number, ranges_n = (3, 20_000, 100_000) if args.quick else (15, 100_000, 1_000_000)
    with ExitStack() as stack:
        rows, ns = build_rows(stack, number)
        per_call = time_rows(rows, ns, rounds, number)
    rel = ratios(rows, per_call)
    rec = recorder_costs(ranges_n)
    flush_n = ranges_n // 5 if args.quick else ranges_n  # (the figure: 1e6 events)
    flush = flush_costs(flush_n)
    print(
        f"mstx_marks {mstx_marks.__version__}, Python {sys.version.split()[0]}, "
        f"{rounds} rounds x {number} calls; ratio = median of per-round ratios"
    )
    print(f"{'row':34} {'ns/call':>9} {'ratio':>7}  reference")
    for name, (_, ref, *_setup) in rows.items():
        print(f"{name:34} {statistics.median(per_call[name]):9.1f} {rel[name]:7.2f}  {ref}")
    print(
        f"\nrecorder: {rec['bytes_per_range']:.1f} bytes/range over {ranges_n} ranges; "
        f"{rec['ns_per_range_depth1_1name']:.0f} ns/range; depth 32 / depth 1 = "
        f"{rec['depth32_over_depth1']:.2f}; "
        f"10000 names / 1 name = {rec['names10000_over_1name']:.2f}"
    )
    checks = []
    for row, op, limit, what in TARGETS:
        if row in rel:
            value = rel[row]
            checks.append(
                (what, value, op, limit, value <= limit if op == "<=" else value >= limit)
            )
    checks.append(
        ("recorder bytes per range", rec["bytes_per_range"], "<=", 64, rec["bytes_per_range"] <= 64)
    )
    for key in ("depth32_over_depth1", "names10000_over_1name"):
        checks.append((f"recorder {key}", rec[key], "<=", 1.25, rec[key] <= 1.25))
    checks.append(
        ("recorder bytes per range (goal)", rec["bytes_per_range"], "<=", 32,
         rec["bytes_per_range"] <= 32)
    )  # fmt: skip
    for key, limit in (
        ("spill_us_per_event", 5.0),
        ("spill_peak_bytes_per_event", 100.0),
        ("export_us_per_event", 5.0),
        ("export_peak_bytes_per_event", 100.0),
    ):
        checks.append((f"exit flush {key}", flush[key], "<=", limit, flush[key] <= limit))
    boot = start_up(3 if args.quick else 9)
    print(
        f"start-up: import mstx_marks {boot['import_warm_ms']:.1f} ms warm "
        f"({boot['import_warm_over_nvtx']:.2f}x nvtx), {boot['import_cold_ms']:.1f} ms cold "
        f"({boot['import_cold_over_nvtx']:.2f}x nvtx); first range {boot['first_range_ms']:.2f} ms"
        f", torch imported: {boot['first_range_imported_torch']}; heavy modules at import: "
        f"{boot['heavy_modules_at_import']}"
    )
    for key, limit in (("import_warm_over_nvtx", 1.0), ("import_cold_over_nvtx", 1.0)):
        checks.append((f"start-up {key}", boot[key], "<=", limit, boot[key] <= limit))
    checks.append(
        ("start-up first range ms (torch installed)", boot["first_range_ms"], "<=", 5.0,
         boot["first_range_ms"] <= 5.0 and not boot["first_range_imported_torch"])
    )  # fmt: skip
    print(
        f"exit flush over {flush_n} events: last spill {flush['spill_us_per_event']:.2f} "
        f"us/event, {flush['spill_peak_bytes_per_event']:.0f} B/event peak; Chrome + DB export "
        f"streamed from the spill {flush['export_us_per_event']:.2f} us/event, "
        f"{flush['export_peak_bytes_per_event']:.0f} B/event peak (the spill read whole, then "
        f"exported: {flush['export_in_memory_us_per_event']:.2f} us/event, "
        f"{flush['export_in_memory_peak_bytes_per_event']:.0f} B/event)"
    )
    print("\ntargets:")
    for what, value, op, limit, ok in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {what}: {value:.2f} {op} {limit}")
    print("\nstanding:")
    for line in standing(rel):
        print(f"  {line}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "ns_per_call": per_call,
                    "ratios": rel,
                    "recorder": rec,
                    "flush": flush,
                    "start_up": boot,
                    "targets": [
                        dict(zip(("what", "value", "op", "limit", "ok"), c)) for c in checks
                    ],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
