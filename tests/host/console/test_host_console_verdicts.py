"""The host console shows each step's verdict: the checker's (recorded by the real agent loop
on the virtual phone), the model's judgement from the next step, a disagreement, and replayed
steps of a learned flow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from host.console import create_app
from host.console.present import step_views
from host.timeline.record import TimelineRecord
from tests.host.console.host_console_support import T_DARK, Filled, log_in


@pytest.fixture
def client(filled: Filled) -> Iterator[TestClient]:
    with TestClient(
        create_app(filled.state), base_url="http://127.0.0.1", follow_redirects=False
    ) as client:
        token = cast(FastAPI, client.app).state.login_token.current
        assert log_in(client, token).status_code == 303
        yield client


def test_the_timeline_shows_the_checker_verdict_of_each_step(
    client: TestClient, filled: Filled
) -> None:
    records = filled.state.store.steps(T_DARK, 1)
    checked = [r for r in records if r.verdict]
    assert checked, "the agent loop checks every device step"
    assert all(r.verdict and r.verdict["verdict"] in ("met", "not_met", "unknown") for r in checked)
    page = client.get(f"/tasks/{T_DARK}").text
    assert page.count('data-field="verdict"') == len(checked)


def _record(index: int, **values: object) -> TimelineRecord:
    return TimelineRecord("t", 1, index, **values)  # type: ignore[arg-type]


def test_the_model_judgement_comes_from_the_next_step_and_disagreement_is_shown() -> None:
    views = step_views(
        [
            _record(1, verdict={"verdict": "met", "evidence": "looked for X: it is open"}),
            _record(
                2,
                previous_step={"verdict": "not_met", "note": "still on Settings"},
                planner_mode="replay",
                flow={"flow_id": "f1", "flow_step": 2, "divergence": ""},
            ),
            _record(
                3,
                planner_mode="compact",
                flow={"flow_id": "f1", "flow_step": 3, "divergence": "its target is not here"},
            ),
        ]
    )
    assert views[0].verdict == "met" and views[0].model_verdict == "not met"
    assert views[0].model_note == "still on Settings" and views[0].disagree
    assert views[1].flow_line == "replayed · flow f1 step 2 · no model call" and views[1].replayed
    assert views[2].flow_line == "took over from flow f1 step 3: its target is not here"
    assert views[2].verdict is None and not views[2].disagree


def test_the_task_page_counts_the_verified_steps(client: TestClient, filled: Filled) -> None:
    records = filled.state.store.steps(T_DARK, 1)
    device = [r for r in records if r.tool_name not in ("complete", "get_ui_tree")]
    words = {"met": "met", "not_met": "not met", "unknown": "unknown"}
    expected = {"met": 0, "not met": 0, "unknown": 0, "unchecked": 0}
    for r in device:
        expected[words[r.verdict["verdict"]] if r.verdict else "unchecked"] += 1
    assert sum(expected.values()) == len(device) and device
    page = client.get(f"/tasks/{T_DARK}").text
    counts = page[page.index('data-field="verdict-counts"') :].split("</dd>")[0]
    for word in ("met", "not met", "unknown"):
        assert f">{expected[word]} {word}</span>" in counts
    assert ("not checked" in counts) == bool(expected["unchecked"])
