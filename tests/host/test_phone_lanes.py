"""The host's phone lanes: a lane is retired once its phone is gone and nothing uses it, never
under an attempt that holds it or a call still running in it."""

from __future__ import annotations

import threading

import pytest

from host.devices.lanes import Lane, PhoneLanes


def _threads(serial: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"phone-{serial}_")]


def test_a_lane_is_kept_while_an_attempt_holds_it_or_a_call_runs_in_it() -> None:
    lanes = PhoneLanes()
    try:
        with lanes.use("gone-1") as lane:
            # The phone vanished just as an attempt picked its lane: the attempt still runs
            # its calls there (its first one finds the phone gone and says so).
            assert lanes.retire(present=set()) == []
            assert lane.submit(lambda: 7).result(timeout=10) == 7
            release = threading.Event()
            abandoned = lane.submit(release.wait, 30)
        # The attempt ended (cancelled) while its call still runs: a lane made now for the
        # same serial would run the next attempt's calls beside it.
        assert lanes.retire(present=set()) == []
        with lanes.use("gone-1") as again:
            assert again is lane
        release.set()
        assert abandoned.result(timeout=10) is True
        assert lanes.retire(present={"other"}) == ["gone-1"]
        assert lanes.serials() == []
        with lanes.use("gone-1") as fresh:
            assert fresh is not lane
            assert fresh.submit(lambda: 8).result(timeout=10) == 8
        assert lanes.retire(present={"gone-1"}) == []
    finally:
        lanes.close()


def test_a_lane_whose_thread_cannot_start_stays_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process out of threads refuses the lane's first call; the call counted before its
    thread started was never uncounted, so the lane never read idle and was never retired.
    (Thread.start is made to fail as CPython fails it: a real exhaustion would take the test
    process down with it.)"""
    lane = Lane("no-threads")

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refused)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            lane.submit(lambda: 1)
    assert lane.idle
    assert lane.submit(lambda: 2).result(timeout=10) == 2  # threads again: it works
    lane.shutdown()
