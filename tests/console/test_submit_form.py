"""The submit form keeps what an operator typed: through a cloud out of reach, and through a
login the expired session sent them to."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from html import unescape

import httpx
import pytest

from console.gateway import create_app
from console.settings import ConsoleSettings
from tests.console.console_stack import UvicornThread
from tests.console.test_pages import csrf_of, log_in


@pytest.fixture
def cloudless(console_settings: ConsoleSettings) -> Iterator[httpx.Client]:
    """A client of a gateway whose cloud is out of reach (nothing listens on its port)."""
    settings = console_settings.model_copy(update={"cloud_address": "127.0.0.1:1"})
    server = UvicornThread(create_app(settings))
    base = server.start()
    try:
        with httpx.Client(base_url=base, timeout=20) as client:
            yield client
    finally:
        server.stop()


def test_the_submit_form_renders_while_the_cloud_is_out_of_reach(
    cloudless: httpx.Client,
) -> None:
    """GET /tasks/new asked the cloud for host suggestions and answered a bare 503 page when
    it was away: nothing to type into. The form renders, says what is missing and why, and a
    post keeps what was typed, saying it was not submitted."""
    assert log_in(cloudless, "/tasks/new").status_code == 303
    page = cloudless.get("/tasks/new")
    assert page.status_code == 200, page.text
    text = unescape(page.text)
    assert 'id="cloud-unavailable"' in text
    assert "host and phone suggestions" in text and "the cloud is not reachable" in text
    assert '<textarea name="goal"' in text

    goal = f"Typed while the cloud was away {uuid.uuid4().hex[:8]}"
    form = {"csrf_token": csrf_of(page.text), "goal": goal, "host_id": "h-1", "max_attempts": "2"}
    posted = cloudless.post("/tasks/new", data=form)
    assert posted.status_code == 503
    text = unescape(posted.text)
    assert "Not submitted: the cloud is not reachable" in text
    assert f">{goal}</textarea>" in text and 'value="h-1"' in text and 'value="2"' in text

    # Submitting an ended task again needs its values: the form says they are missing.
    again = unescape(cloudless.get(f"/tasks/new?again={'a' * 32}").text)
    assert f"the goal and target of task {'a' * 32}" in again
