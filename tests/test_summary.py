from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.recorded import T0, records, rng, synthetic_rank

from mstx_marks.analysis.model.steps import DEFAULT_STEP_NAMES
from mstx_marks.analysis.summary import (
    fold_name,
    format_json,
    format_table,
    load_traces,
    summarize,
    summarize_path,
)
from mstx_marks.base.records import Member, RangeRecord, Record
from mstx_marks.cli.main import main as cli_main
from mstx_marks.export import (
    RankTrace,
    chrome_trace_path,
    export_rank,
    write_ascend_db,
    write_chrome_trace,
)


def M(rank: int, role: str = "") -> Member:
    return Member(role, rank)


def test_stats_per_rank_and_across_ranks() -> None:
    traces = [synthetic_rank(0, steps=3, tokens=4), synthetic_rank(1, steps=3, tokens=4, slow=300)]
    s = summarize(traces, fold=str)
    assert [p.name for p in s.phases] == ["step", "gen", "vllm_one_step", "update_actor"]
    assert s.step_time_ns == {M(0): 3000, M(1): 3900} and s.step_count == {M(0): 3, M(1): 3}
    upd = s.phases[3]
    assert upd.per_rank[0].count == 3 and upd.per_rank[0].total_ns == 3 * 290
    assert upd.per_rank[1].max_ns == 590 and upd.overall.count == 6
    assert upd.overall.total_ns == 3 * 290 + 3 * 590
    assert upd.slowest_rank == 1 and upd.imbalance == pytest.approx(590 / 290)
    assert upd.per_rank[0].step_share == pytest.approx(870 / 3000)
    assert upd.overall.step_share == pytest.approx((870 + 1770) / 6900)
    token = s.phases[2].overall
    assert token.count == 24 and token.p50_ns == token.p90_ns == token.mean_ns == 40


@settings(max_examples=80, deadline=None)
@given(durs=st.lists(st.integers(0, 10**9), min_size=1, max_size=30))
def test_percentiles_match_statistics(durs: list[int]) -> None:
    recs, t = [], 0
    for d in durs:
        recs.append(rng("x", t, t + d))
        t += d + 1
    (p,) = summarize([RankTrace(0, recs)], fold=str).phases
    want = statistics.quantiles(durs, n=10, method="inclusive") if len(durs) > 1 else [durs[0]] * 9
    assert p.overall.p90_ns == pytest.approx(want[8])
    assert p.overall.p50_ns == pytest.approx(statistics.median(durs))
    assert p.overall.max_ns == max(durs) and p.overall.total_ns == sum(durs)
    # No steps: the share is of the rank's whole recorded span.
    span = t - 1
    assert p.overall.step_share == (pytest.approx(sum(durs) / span) if span else None)


def test_aliases_fold_into_one_phase() -> None:
    recs = [rng("step", 0, 100), rng("update_actor", 0, 10), rng("actor_update", 20, 50)]
    (_, upd) = summarize([RankTrace(0, recs)]).phases
    assert upd.overall.count == 2 and upd.name == fold_name("update_actor")
    assert fold_name("actor_update") == fold_name("update_actor")
    assert fold_name("my_own_phase") == "my_own_phase"


def test_tree_of_ranks_prefers_databases_and_reports_bad_files(tmp_path: Path) -> None:
    for rank in range(3):
        export_rank(tmp_path, synthetic_rank(rank, slow=100 * rank))
    bad_db = tmp_path / "ascend" / "x_1_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    bad_db.mkdir(parents=True)
    (bad_db / "ascend_pytorch_profiler_9.db").write_bytes(b"garbage" * 200)
    (tmp_path / "cut.trace.json").write_text('{"traceEvents": [{"ph": "X"')
    traces, errors, notes = load_traces(tmp_path)
    assert [t.rank for t in traces] == [0, 1, 2]
    assert all(t.source is not None and t.source.suffix == ".db" for t in traces)
    assert notes == []  # each Chrome trace holds what its database holds: nothing to say
    assert sorted(Path(e.split(": ")[0]).name for e in errors) == [
        "ascend_pytorch_profiler_9.db",
        "cut.trace.json",
    ]


def test_mixed_clocks_leave_out_the_odd_file(tmp_path: Path) -> None:
    for rank in range(2):
        write_chrome_trace(tmp_path / f"r{rank}.trace.json", [synthetic_rank(rank)])
    since_boot = [
        r._replace(start_ns=r.start_ns - T0, end_ns=r.end_ns - T0)
        if isinstance(r, RangeRecord)
        else r._replace(start_ns=r.start_ns - T0)
        for r in synthetic_rank(2).records
    ]
    boot = RankTrace(2, since_boot)
    write_ascend_db(tmp_path / "ascend_pytorch_profiler_2.db", boot)
    traces, errors, _ = load_traces(tmp_path)
    assert [t.rank for t in traces] == [0, 1]
    assert len(errors) == 1 and "ascend_pytorch_profiler_2.db" in errors[0]
    assert "different clock" in errors[0]


def test_cli_table_csv_json_and_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank in range(2):
        export_rank(tmp_path, synthetic_rank(rank, slow=50 * rank))
    assert cli_main(["summary", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "update_actor" in table and "(rank 1)" in table and "2 ranks;" in table

    assert cli_main(["summary", str(tmp_path), "--csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("phase,rank,count,total_ns")
    assert len(rows) == 1 + 4 * 3  # four phases: an "all" row and two ranks each

    svg = tmp_path / "t.svg"
    assert cli_main(["summary", str(tmp_path), "--json", "--svg", str(svg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["phases"][0]["name"] == "step" and set(doc["ranks"]) == {"0", "1"}
    assert svg.read_text().startswith("<svg")

    (tmp_path / "broken.trace.json").write_text("{")
    assert cli_main(["summary", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "broken.trace.json" in err and "update_actor" in out  # the rest still summarised

    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["summary", str(empty)]) == 2  # as coverage, and the troubleshooting page
    assert "no traces found" in capsys.readouterr().err
    assert cli_main(["summary", os.fspath(tmp_path / "missing")]) == 1
    assert "no such file" in capsys.readouterr().err


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note:")]


def test_a_rank_in_a_database_and_an_equal_chrome_trace_needs_no_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank in range(2):
        export_rank(tmp_path, synthetic_rank(rank))  # the database and the Chrome trace agree
    write_chrome_trace(tmp_path / "trace.json", [synthetic_rank(0), synthetic_rank(1)])
    assert cli_main(["summary", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "2 ranks;" in out and _notes(err) == []


def test_ranks_whose_files_disagree_get_one_note_in_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank in range(3):
        export_rank(tmp_path, synthetic_rank(rank, steps=3))
    for rank in (0, 2):  # these two ranks' Chrome traces now hold one more step
        write_chrome_trace(chrome_trace_path(tmp_path, rank), [synthetic_rank(rank, steps=4)])
    assert cli_main(["summary", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    (note,) = _notes(err)
    assert "2 ranks (0, 2)" in note and "using the databases" in note
    assert "rank 1" not in note and "1," not in note
    ranks = json.loads(out)["ranks"]
    assert all(ranks[r]["source"].endswith(".db") and ranks[r]["steps"] == 3 for r in ranks)

    # Two Chrome traces of one rank that disagree: the newest is used, and said once.
    other = tmp_path / "other"
    other.mkdir()
    older, newer = other / "a.trace.json", other / "b.trace.json"
    write_chrome_trace(older, [synthetic_rank(5, steps=2)])
    write_chrome_trace(newer, [synthetic_rank(5, steps=1)])
    os.utime(older, (1_000_000, 1_000_000))
    traces, errors, notes = load_traces(other)
    assert errors == [] and traces[0].source == newer and len(traces[0].with_steps().steps) == 1
    assert len(notes) == 1 and "rank 5 is" in notes[0] and "newest" in notes[0]


def test_svg_into_a_missing_folder_fails_first_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export_rank(tmp_path, synthetic_rank(0))
    missing = tmp_path / "no" / "such"
    assert cli_main(["summary", str(tmp_path), "--svg", str(missing / "t.svg")]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # it stopped before reading or summarising anything
    assert f"the folder {missing} does not exist" in err
    assert not (tmp_path / "no").exists()

    a_file = tmp_path / "plain.txt"
    a_file.write_text("")
    assert cli_main(["summary", str(tmp_path), "--svg", str(a_file / "t.svg")]) == 2
    assert f"the folder {a_file} is not a folder" in capsys.readouterr().err

    # From the command line: exit code 2, one clear line, no traceback.
    cmd = [sys.executable, "-m", "mstx_marks", "summary", str(tmp_path), "--svg"]
    proc = subprocess.run([*cmd, str(missing / "t.svg")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.strip()
        == f"error: --svg {missing / 't.svg'}: the folder {missing} does not exist"
    )
    assert not (tmp_path / "no").exists()


def test_spills_are_read_and_processes_of_one_rank_are_summed(
    tmp_path: Path, roles: tuple[str, str] = ("actor", "actor")
) -> None:
    """MSTX_MARKS_OUT: two processes of one role that both say rank 0 (Ray actors without
    RANK), one of them killed (only its spill is left), the other also exported at exit."""
    from mstx_marks.backends.record import Recorder
    from mstx_marks.export.spill import Spill

    for pid_shift, names in ((0, ["gen", "gen"]), (1, ["update_actor"])):
        rec = Recorder()
        rec._pid += pid_shift  # two processes: pids differ
        for n in names:
            rec.range_end(rec.range_start(n, "default"), "default")
        spill = Spill(tmp_path, rec, rank=0, role=roles[pid_shift])
        spill.path = spill.path.with_name(f"host-{rec._pid}.jsonl")
        spill.write_now()
        if pid_shift == 0:  # this one also wrote its exports; they must not count twice
            export_rank(tmp_path, RankTrace(0, rec.records(), role=roles[0]), process="p0")
    traces, errors, notes = load_traces(tmp_path)
    assert errors == [] and notes == []
    if roles[0] != roles[1]:
        return
    (rank0,) = traces
    assert sorted(r.name for r in rank0.records) == ["gen", "gen", "update_actor"]
    assert rank0.role == "actor"


def test_processes_of_one_rank_in_different_roles_are_never_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One GPU's trainer and rollout engine both say rank 0: only their roles tell them apart,
    and every output keeps them apart (files read back, summary text, JSON, CSV)."""
    test_spills_are_read_and_processes_of_one_rank_are_summed(tmp_path, ("TaskRunner", "Engine"))
    traces, errors, _ = load_traces(tmp_path)
    assert errors == []
    assert [(t.role, t.rank, sorted(r.name for r in t.records)) for t in traces] == [
        ("Engine", 0, ["update_actor"]),
        ("TaskRunner", 0, ["gen", "gen"]),
    ]
    for streamed in (summarize_path(tmp_path, jobs=1), summarize(traces)):
        assert [(p.role, p.name, list(p.per_rank)) for p in streamed.phases] == [
            ("Engine", "update_actor", [0]),
            ("TaskRunner", fold_name("gen"), [0]),
        ]
        assert streamed.members() == [M(0, "Engine"), M(0, "TaskRunner")]
    assert cli_main(["summary", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "2 roles, 2 processes: Engine (1 rank), TaskRunner (1 rank)"
    blocks = [line for line in table if line.startswith("== ")]
    assert [b.split(" == ")[0] for b in blocks] == ["== Engine", "== TaskRunner"]
    assert cli_main(["summary", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["roles"] == ["Engine", "TaskRunner"]
    assert {k: (v["role"], v["rank"]) for k, v in doc["ranks"].items()} == {
        "Engine:0": ("Engine", 0),
        "TaskRunner:0": ("TaskRunner", 0),
    }
    assert [(p["role"], p["name"], set(p["ranks"])) for p in doc["phases"]] == [
        ("Engine", "update_actor", {"0"}),
        ("TaskRunner", fold_name("gen"), {"0"}),
    ]
    assert cli_main(["summary", str(tmp_path), "--csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].endswith(",role") and {r.rsplit(",", 1)[1] for r in rows[1:]} == {
        "Engine",
        "TaskRunner",
    }


def _part_key(part: object) -> object:
    from mstx_marks.analysis.model.aggregate import ProcessPart

    assert isinstance(part, ProcessPart)
    phases = {
        n: (a.count, a.total_ns, a.max_ns, a.p50_ns, a.p90_ns, a.first_start_ns, a.self_ns)
        for n, a in part.phases.items()
    }
    steps = part.step_count, part.step_time_ns, part.step_keys, part.step_phases
    breakdown = part.unmarked_ns, part.concurrent_ns, part.outside_ns
    return part.rank, part.pids, part.n_records, part.span, part.first_ns, steps, phases, breakdown


@settings(max_examples=40, deadline=None)
@given(recs=records(), named=st.booleans())
def test_a_database_summarised_in_sql_equals_its_records_summarised(
    tmp_path_factory: pytest.TempPathFactory, recs: list[Record], named: bool
) -> None:
    from mstx_marks.analysis.model.aggregate import aggregate_trace
    from mstx_marks.analysis.model.steps import StepOptions
    from mstx_marks.analysis.readers.ascend_sql import aggregate_db
    from mstx_marks.export import read_ascend_db

    path = tmp_path_factory.mktemp("db") / "ascend_pytorch_profiler_4.db"
    write_ascend_db(path, RankTrace(4, recs))
    steps = StepOptions("gen") if named else None
    from_sql = aggregate_db(path, steps=steps)
    from_records = aggregate_trace(read_ascend_db(path), steps=steps)
    assert _part_key(from_sql) == _part_key(from_records)


def test_streamed_in_parallel_equals_read_in_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mstx_marks.analysis.summary import summarize_path

    for rank in range(6):
        export_rank(tmp_path, synthetic_rank(rank, steps=2 + rank % 2, slow=40 * rank))
    traces, errors, notes = load_traces(tmp_path)
    streamed = summarize_path(tmp_path, jobs=2)
    assert streamed.errors == errors == [] and streamed.notes == notes == []
    assert format_json(streamed) == format_json(summarize(traces))
    # 12 files (a database and a Chrome trace per rank): a progress line on stderr
    assert "reading traces: 12/12 files" in capsys.readouterr().err
    summarize_path(tmp_path, jobs=2, progress=False)
    assert capsys.readouterr().err == ""


def test_cross_rank_percentiles_are_exact_or_within_the_sketch_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mstx_marks.analysis.model import aggregate
    from mstx_marks.analysis.model.quantiles import RELATIVE_ERROR, percentile

    traces = []
    for rank in range(4):
        recs, t = [], 0
        for i in range(300):
            d = 1000 + (i * 7919 + rank * 104729) % 50_000
            recs.append(rng("gen", t, t + d))
            t += d + 1
        traces.append(RankTrace(rank, recs))
    pooled = sorted(r.duration_ns for t in traces for r in t.ranges)
    exact = summarize(traces, fold=str).phases[0].overall
    assert exact.p90_ns == percentile(pooled, 0.9) and exact.percentile_error == 0
    monkeypatch.setattr(aggregate, "POOL_LIMIT", 100)  # too many to pool: merged sketches
    approx = summarize(traces, fold=str)
    (gen,) = approx.phases
    assert gen.overall.percentile_error == RELATIVE_ERROR
    for q, got in ((0.5, gen.overall.p50_ns), (0.9, gen.overall.p90_ns)):
        assert abs(got - percentile(pooled, q)) <= RELATIVE_ERROR * percentile(pooled, q)
    assert gen.overall.total_ns == sum(pooled) and gen.overall.count == len(pooled)
    for rank, t in enumerate(traces):  # per rank: exact
        own = sorted(r.duration_ns for r in t.ranges)
        assert gen.per_rank[rank].p90_ns == percentile(own, 0.9)
    assert "~ p50/p90 of this 'all' row are within 0.5%" in format_table(approx)


def test_ranks_of_several_processes_are_summed_exactly_when_streamed(tmp_path: Path) -> None:
    from mstx_marks.analysis.summary import summarize_path
    from mstx_marks.export.spill import read_spill

    test_spills_are_read_and_processes_of_one_rank_are_summed(tmp_path)
    streamed = summarize_path(tmp_path, jobs=2)
    traces, _, _ = load_traces(tmp_path)
    assert streamed.errors == [] and format_json(streamed) == format_json(summarize(traces))
    assert {p.name: p.overall.count for p in streamed.phases} == {
        fold_name("gen"): 2,
        "update_actor": 1,
    }
    assert len(list((tmp_path / "spill").glob("*.jsonl"))) == 2
    assert read_spill(next((tmp_path / "spill").glob("*.jsonl"))).rank == 0


def test_bad_input_never_gives_a_traceback(tmp_path: Path) -> None:
    import sqlite3

    export_rank(tmp_path, synthetic_rank(0))
    (tmp_path / "deep.trace.json").write_text("[" * 200_000 + "]" * 200_000)
    blob = tmp_path / "b" / "ascend_pytorch_profiler_1.db"
    write_ascend_db(blob, synthetic_rank(1))
    with sqlite3.connect(blob) as db:  # names stored as BLOBs, one not even UTF-8
        db.execute("UPDATE STRING_IDS SET value = CAST(value AS BLOB)")
        db.execute("UPDATE STRING_IDS SET value = X'67656eff' WHERE value = CAST('gen' AS BLOB)")
    db.close()
    cmd = [sys.executable, "-m", "mstx_marks", "summary", str(tmp_path), "--json"]
    for extra in ([], ["--svg", str(tmp_path / "t.svg")]):  # streamed, and read in memory
        proc = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "deep.trace.json: is JSON nested too deeply" in proc.stderr
        doc = json.loads(proc.stdout)
        assert set(doc["ranks"]) == {"0", "1"}
        assert "gen\ufffd" in {p["name"] for p in doc["phases"]}


def test_a_folder_that_cannot_be_read_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    export_rank(tmp_path / "ok", synthetic_rank(0))
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.scandir

    def scandir(path: object = ".") -> object:
        if Path(str(path)) == locked:  # as for a folder of another user's (root reads all)
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    assert cli_main(["summary", str(tmp_path), "--jobs", "1"]) == 1
    out, err = capsys.readouterr()
    assert f"error: {locked}: the folder cannot be read (Permission denied)" in err
    assert "update_actor" in out  # the rest is summarised


def test_control_characters_in_names_are_escaped_in_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = RankTrace(0, [rng("step", 0, 100), rng("gen\x1b[2J\r\x00", 0, 50)])
    write_chrome_trace(tmp_path / "r.trace.json", [trace])
    assert cli_main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gen\\x1b[2J\\r\\x00" in out and "\x1b" not in out and "\r" not in out
    assert cli_main(["summary", str(tmp_path), "--json"]) == 0
    assert "gen\x1b[2J\r\x00" in {p["name"] for p in json.loads(capsys.readouterr().out)["phases"]}


def test_the_unmarked_row_keeps_the_columns_when_phase_names_are_short() -> None:
    """``(unmarked)`` is wider than ``phase``: with names shorter than it, its row was shifted
    right of every column."""
    traces = [
        RankTrace(k, [rng("step", 0, 1000), rng("a", 0, 300), rng("b", 400, 500)]) for k in (0, 1)
    ]
    lines = format_table(summarize(traces, fold=str)).splitlines()
    header = next(line for line in lines if line.startswith("phase "))
    rank_end = header.index(" rank") + len(" rank")
    share_end = header.index("step %") + len("step %")
    at = next(i for i, line in enumerate(lines) if line.startswith("(unmarked)"))
    unmarked, *per_rank = lines[at : at + 3]
    assert unmarked[:rank_end].endswith(" all") and unmarked[:share_end].endswith(" 60.0")
    assert [line[:rank_end].split() for line in per_rank] == [["0"], ["1"]]
    for line in lines[lines.index(header) + 1 : at]:  # every phase row: the same columns
        assert line[:rank_end].split()[-1] in ("all", "0", "1"), line
        assert line[rank_end] == " "


@pytest.mark.parametrize("name", DEFAULT_STEP_NAMES)
def test_a_run_without_steps_is_told_every_name_that_makes_them(name: str) -> None:
    """The note names each default step name (what steps.py recognises, not a copy), and each
    name it gives does make steps."""
    stepless = format_table(summarize([RankTrace(0, [rng("gen", 0, 100)])], fold=str))
    note = " ".join(stepless[stepless.index("no steps:") :].split())
    assert f" {name} " in note or f" {name}," in note or note.endswith(f" {name}")
    assert "STEP_TIME" in note and "--step-name" in note
    stepped = summarize([RankTrace(0, [rng(name, 0, 100), rng("gen", 0, 50)])], fold=str)
    assert stepped.step_count == {M(0): 1}
    assert "no steps:" not in format_table(stepped)
