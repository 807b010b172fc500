"""The fast path calls torch_npu's C entry points with exactly what the real wrapper would pass.

The same program of every call shape (host-only and stream ranges, default and named domains,
a filtered domain whose id is 0, instants) runs once through the mstx backend's direct C calls
and once through the REAL torch_npu 2.14.0 ``mstx`` wrapper; the C layer must see identical calls.
"""

from __future__ import annotations

from typing import Any

from support.fake_mstx_c import Stream, capture_output
from support.real_torch_npu import install_real

from mstx_marks import configure, instant, mark, mstx_range
from mstx_marks.backends.mstx import MstxBackend


def _program() -> None:
    stream = Stream(3, 1)

    @mstx_range("update_actor", domain="verl")
    def update() -> None:
        with mark("micro_batch0"), mark("on_device", domain="verl", stream=stream):
            instant("host_instant", domain="verl")
            instant("device_instant", stream=stream)
        with mark("current", stream="current"):
            pass
        with mark("dropped", domain="communication"):  # filtered by the collector: id 0
            pass

    update()


def _c_calls(direct: bool) -> list[tuple[Any, ...]]:
    with install_real() as env, capture_output() as cap:
        backend = MstxBackend()
        if not direct:
            assert backend.degrade()  # from now on every call goes through torch_npu's wrapper
        configure(backend=backend)
        with env.collect(exclude=["communication"]):
            _program()
        calls = list(env.c.calls)
    # The real wrapper accepted every call: it neither warned nor printed. (Warnings of our own,
    # about bad streams that earlier tests left in long-lived gates, are not its doing.)
    foreign = [text for _, text in cap.warnings if not text.startswith("mstx_marks:")]
    assert not foreign and not cap.lines, (foreign, cap.lines)
    return calls


def test_direct_calls_equal_the_real_wrappers_calls() -> None:
    direct, wrapped = _c_calls(direct=True), _c_calls(direct=False)
    assert direct == wrapped
    kinds = {call[0] for call in direct}
    assert kinds == {"range_start_on_host", "range_start", "range_end", "mark_on_host", "mark"}
    # id 0 (the filtered domain) never reaches range_end; every other range ends exactly once.
    ends = [call[1] for call in direct if call[0] == "range_end"]
    starts = [call for call in direct if call[0].startswith("range_start")]
    assert len(ends) == len(starts) - 1 and 0 not in ends and len(set(ends)) == len(ends)
