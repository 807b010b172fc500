"""names.py: the rules every range name and domain satisfies, refused where they are made."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import caught

import mstx_marks
from mstx_marks import MAX_NAME_BYTES, Phase, instant, mark, mstx_range

# --- names and domains ----------------------------------------------------------------------------

BAD_DOMAINS = ["", "vérl", "a-b", "a.b", "a b", "verl!", "日本"]
NON_STR = [b"verl", 1, 1.5, ["verl"]]


@pytest.mark.parametrize("domain", BAD_DOMAINS)
@pytest.mark.parametrize("api", ["mark", "mstx_range", "instant", "phase"])
def test_bad_domain_names_are_refused_naming_the_value(domain: str, api: str) -> None:
    with pytest.raises(ValueError) as info:
        {
            "mark": lambda: mark("n", domain=domain),
            "mstx_range": lambda: mstx_range("n", domain=domain),
            "instant": lambda: instant("n", domain=domain),
            "phase": lambda: Phase("n", domain),
        }[api]()
    assert repr(domain) in str(info.value)


@pytest.mark.parametrize("domain", [b"verl", 1])
def test_non_str_domains_are_type_errors(domain: Any) -> None:
    for call in (lambda: mark("n", domain=domain), lambda: instant("n", domain=domain)):
        with pytest.raises(TypeError) as info:
            call()
        assert repr(domain) in str(info.value)


@pytest.mark.parametrize("name", [*NON_STR, None])
def test_non_str_names_are_type_errors(name: Any) -> None:
    for call in (lambda: mark(name), lambda: instant(name)):
        with pytest.raises(TypeError) as info:
            call()
        assert repr(name) in str(info.value)
    if not callable(name) and name is not None:
        with pytest.raises(TypeError) as info:
            mstx_range(name)
        assert repr(name) in str(info.value)


def test_empty_names_are_value_errors() -> None:
    for call in (lambda: mark(""), lambda: instant(""), lambda: mstx_range(""), lambda: Phase("")):
        with pytest.raises(ValueError, match="''"):
            call()


def test_non_ascii_names_are_fine(recorder: mstx_marks.Recorder) -> None:
    with mark("生成 sequences"):
        pass
    assert recorder.records()[0].name == "生成 sequences"


def test_overlong_names_are_errors_for_mstx_range_and_phase() -> None:
    ok = "é" * (MAX_NAME_BYTES // 2)  # exactly 156 bytes
    assert mstx_range(ok).name == ok
    for bad in ("x" * (MAX_NAME_BYTES + 1), "é" * (MAX_NAME_BYTES // 2 + 1)):
        with pytest.raises(ValueError, match="156"):
            mstx_range(bad)
        with pytest.raises(ValueError, match="156"):
            Phase(bad)


def test_overlong_runtime_names_are_truncated_with_one_warning(
    recorder: mstx_marks.Recorder,
) -> None:
    with caught() as w:
        for i in range(3):
            with mark(f"{i}" + "é" * 100):
                pass
        instant("y" * 300)
    assert len(w) == 1 and "truncated" in str(w[0].message)
    got = [r.name for r in recorder.records()]
    assert got[:3] == [f"{i}" + "é" * 77 for i in range(3)]  # 155 bytes: no half character
    assert got[3] == "y" * MAX_NAME_BYTES
    assert all(len(n.encode()) <= MAX_NAME_BYTES for n in got)


UNFIT = ["a\x00b", "tab\there", "new\nline", "del\x7f", "c1\x85", "lone\ud800", "\udfffx"]


@pytest.mark.parametrize("name", UNFIT, ids=ascii)
def test_names_with_control_characters_or_lone_surrogates_are_refused_at_definition(
    name: str,
) -> None:
    for define in (mstx_range, Phase):
        with pytest.raises(ValueError, match="holds") as info:
            define(name)
        assert repr(name[:5])[:-1] in str(info.value)  # the value is named


@pytest.mark.parametrize("name", UNFIT, ids=ascii)
def test_runtime_names_with_control_characters_are_replaced_with_one_warning(
    recorder: mstx_marks.Recorder, name: str
) -> None:
    with caught() as w:
        for _ in range(3):
            with mark(name):
                instant(name)
    assert len(w) == 1 and "U+FFFD" in str(w[0].message)
    got = {r.name for r in recorder.records()}
    assert len(got) == 1
    (clean,) = got
    assert "\ufffd" in clean and clean.isprintable()
    clean.encode("utf-8")  # what the C layer needs: no lone surrogate left


def test_printable_unicode_names_are_kept_as_they_are(recorder: mstx_marks.Recorder) -> None:
    names = ["caf\u00e9", "nbsp\u00a0x", "zero\u200bwidth", "日本語"]
    with caught() as w:
        for n in names:
            with mark(n):
                pass
    assert not w
    assert [r.name for r in recorder.records()] == names


@pytest.mark.parametrize("stream", [5, 0, True, [], (), 1.5, b"s", {}], ids=repr)
@pytest.mark.parametrize("api", ["mark", "mstx_range", "instant"])
def test_a_stream_that_cannot_be_one_is_refused_at_definition(stream: Any, api: str) -> None:
    define = {
        "mark": lambda: mark("x", stream=stream),
        "mstx_range": lambda: mstx_range("x", stream=stream),
        "instant": lambda: instant("x", stream=stream),
    }[api]
    with pytest.raises(TypeError, match="stream must be None, 'current' or a stream object"):
        define()


@pytest.mark.parametrize("domain", [["verl"], {"verl": 1}])
def test_an_unhashable_domain_is_refused_with_the_rule(domain: Any) -> None:
    with pytest.raises(TypeError, match="domain must be a str"):
        mark("x", domain=domain)
    with pytest.raises(TypeError, match="domain must be a str"):
        instant("x", domain=domain)
