"""A long attempt on the host console: the task page shows its newest 50 steps (the earlier
ones on pages of their own, read from the store a window at a time), counts and costs the
whole attempt, and holds no prompt: each step's prompts are a page of their own."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from host.console import create_app
from host.timeline.store import TimelineStore
from tests.host.console.host_console_support import (
    LONG_STEPS,
    T_LONG,
    StoreOnly,
    fill_long_attempt,
    log_in,
    long_step,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TimelineStore]:
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    fill_long_attempt(store)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def client(store: TimelineStore) -> Iterator[TestClient]:
    app = create_app(StoreOnly(store))
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as c:
        assert log_in(c, app.state.login_token.current).status_code == 303
        yield c


def _shown(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'class="step card" id="step-(\d+)"', html)]


def test_a_long_attempt_shows_its_newest_50_steps_and_links_the_earlier_ones(
    client: TestClient,
) -> None:
    page = client.get(f"/tasks/{T_LONG}")
    assert page.status_code == 200
    html = page.text
    assert _shown(html) == list(range(13, LONG_STEPS + 1))
    earlier = f"/tasks/{T_LONG}/attempts/1/steps?through=12"
    assert f'<a href="{earlier}">12 earlier steps →</a>' in html
    # The counts, the cost and the live view's count are the whole attempt's 62 steps.
    assert '<dd data-field="steps">62</dd>' in html
    assert 'data-count="62"' in html
    assert ">42 met</span>" in html and ">20 not met</span>" in html  # every third not met
    assert '<dd data-field="cost">744 tokens · $0.0620</dd>' in html
    # No prompt is in the page: each step links its own.
    assert "prompt of step" not in html
    assert 'data-src="/tasks/task-long/attempts/1/steps/62/prompts"' in html

    first = client.get(earlier).text
    assert _shown(first) == list(range(1, 13))
    assert "step 12 looked right" in first  # its judgement, from step 13 (not shown here)
    assert 'rel="prev"' not in first
    assert f'href="/tasks/{T_LONG}/attempts/1/steps?through=62" rel="next"' in first
    assert "prompt of step" not in first

    window = client.get(f"/tasks/{T_LONG}/attempts/1/steps", params={"through": 62}).text
    assert _shown(window) == list(range(13, 63))
    assert f'href="/tasks/{T_LONG}/attempts/1/steps?through=12" rel="prev"' in window
    assert 'rel="next"' not in window


def test_a_step_s_prompts_are_a_page_of_their_own(client: TestClient) -> None:
    prompts = client.get(f"/tasks/{T_LONG}/attempts/1/steps/5/prompts")
    assert prompts.status_code == 200
    body = prompts.text
    assert "system prompt of step 5" in body and "user prompt of step 5" in body
    assert "prompt of step 4" not in body and "prompt of step 6" not in body
    for missing in (
        f"/tasks/{T_LONG}/attempts/1/steps/63/prompts",
        f"/tasks/{T_LONG}/attempts/2/steps/5/prompts",
        "/tasks/no-such-task/attempts/1/steps/5/prompts",
        f"/tasks/{T_LONG}/attempts/2/steps?through=5",
        "/tasks/no-such-task/attempts/1/steps?through=5",
    ):
        assert client.get(missing).status_code == 404, missing


@pytest.mark.parametrize(
    "query",
    [{}, {"through": 0}, {"through": 2**31}, {"through": "1_0"}, {"through": "x"}],
)
def test_a_bad_window_is_refused(client: TestClient, query: dict[str, int | str]) -> None:
    response = client.get(f"/tasks/{T_LONG}/attempts/1/steps", params=query)
    assert response.status_code == 422, response.text


def test_the_live_view_adds_the_steps_after_the_newest_shown(
    client: TestClient, store: TimelineStore
) -> None:
    live = f"/tasks/{T_LONG}/live"
    nothing = client.get(live, params={"attempt": 1, "after": LONG_STEPS}).json()
    assert nothing["count"] == LONG_STEPS and nothing["html"] == ""
    store.append_step(long_step(LONG_STEPS + 1))
    more = client.get(live, params={"attempt": 1, "after": LONG_STEPS}).json()
    assert more["count"] == LONG_STEPS + 1
    assert _shown(more["html"]) == [LONG_STEPS + 1]
    # The summary's counts and cost follow the new step (63 is a third: not met), as a page
    # opened now shows them; a poll that brings no step leaves them alone.
    assert ">42 met</span>" in more["verdicts_html"]
    assert ">21 not met</span>" in more["verdicts_html"]
    assert more["cost"] == "756 tokens · $0.0630"
    page = client.get(f"/tasks/{T_LONG}").text
    assert f'<dd data-field="cost">{more["cost"]}</dd>' in page
    assert more["verdicts_html"].strip() in page
    assert "cost" not in nothing and "verdicts_html" not in nothing
