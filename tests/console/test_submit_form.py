"""The submit form keeps what an operator typed: through a cloud out of reach, and through a
login the expired session sent them to."""

from __future__ import annotations

import base64
import logging
import re
import uuid
from collections.abc import Iterator
from html import unescape

import httpx
import pytest

from amc.v1 import types_pb2
from cloud import pki as cloud_pki
from console.gateway import create_app
from console.gateway.app import SESSION_COOKIE
from console.settings import ConsoleSettings
from tests.console.console_stack import Operator, UvicornThread
from tests.console.test_pages import csrf_of, log_in
from webui.sessions import SessionStore


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


def test_a_refused_gateway_keeps_the_form_without_telling_to_try_again(
    console_settings: ConsoleSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Every failed submit but a 409/422 came back as "Submit again when the cloud answers",
    unlogged: a gateway whose certificate the cloud refuses (PERMISSION_DENIED, a 502) told
    its operator to wait for a cloud that was answering, and the refusal reached no log. The
    form still comes back as typed; the cloud's words are said as they are, and logged."""
    certs = console_settings.certs_dir
    assert certs is not None
    cloud_pki.write_host_cert(certs, "not-a-gateway")
    settings = console_settings.model_copy(
        update={
            "client_cert": certs / "host-not-a-gateway.pem",
            "client_key": certs / "host-not-a-gateway.key",
        }
    )
    server = UvicornThread(create_app(settings))
    base = server.start()
    try:
        with httpx.Client(base_url=base, timeout=20) as client:
            assert log_in(client, "/tasks/new").status_code == 303
            page = client.get("/tasks/new")
            goal = f"Typed at a refused gateway {uuid.uuid4().hex[:8]}"
            form = {"csrf_token": csrf_of(page.text), "goal": goal, "max_attempts": "2"}
            with caplog.at_level(logging.WARNING, logger="console.gateway.pages"):
                posted = client.post("/tasks/new", data=form)
    finally:
        server.stop()
    assert posted.status_code == 502, posted.text
    text = unescape(posted.text)
    assert "Not submitted: this RPC needs an operator certificate" in text, text
    assert "Submit again when the cloud answers" not in text
    assert f">{goal}</textarea>" in text
    assert "PERMISSION_DENIED" in caplog.text


def test_a_form_posted_after_the_session_expired_comes_back_filled_in_after_the_login(
    console_settings: ConsoleSettings,
) -> None:
    """A submit whose session had expired led to /login and back to an empty form: the goal
    and target typed were gone. The post is kept on the gateway (not in a URL or the
    cookie), and after the login the form comes back as typed, once, with its idempotency
    key and a banner saying nothing was queued. The sessions run on a clock the test moves,
    so the session really expires on the gateway."""
    now = [1000.0]
    app = create_app(console_settings)
    app.state.sessions = SessionStore(3600, clock=lambda: now[0])
    server = UvicornThread(app)
    base = server.start()
    goal = f"Typed before the session expired {uuid.uuid4().hex[:8]}\nsecond line"
    try:
        with httpx.Client(base_url=base, timeout=20) as client:
            assert log_in(client, "/tasks/new").status_code == 303
            page = client.get("/tasks/new").text
            request_id = re.search(r'name="client_request_id" value="([^"]+)"', page)
            assert request_id
            typed = {
                "csrf_token": csrf_of(page),
                "client_request_id": request_id.group(1),
                "goal": goal,
                "host_id": "h-kept",
                "device_serial": "emulator-5554",
                "max_attempts": "3",
                "no_replay": "1",
            }
            now[0] += 2 * 3600  # the session has expired
            own_page = {"origin": base, "referer": f"{base}/tasks/new"}
            posted = client.post("/tasks/new", data=typed, headers=own_page)
            assert posted.status_code == 303, posted.text
            assert posted.headers["location"] == "/login?next=%2Ftasks%2Fnew"
            cookie = client.cookies[SESSION_COOKIE].split(".")[0]
            assert "Typed before" not in base64.b64decode(cookie + "==").decode(errors="replace")
            assert goal.split()[0] not in posted.headers["location"]

            assert log_in(client, "/tasks/new").headers["location"] == "/tasks/new"
            back = client.get("/tasks/new")
            text = unescape(back.text)
            assert 'id="submit-restored"' in text and "nothing was queued" in text
            assert f">{goal}</textarea>" in text
            assert 'value="h-kept"' in text and 'value="emulator-5554"' in text
            assert 'value="3"' in text and 'value="1" checked' in text
            assert f'value="{typed["client_request_id"]}"' in text
            # Once: the next visit is a fresh form.
            fresh = unescape(client.get("/tasks/new").text)
            assert goal not in fresh and 'id="submit-restored"' not in fresh

            # A post from another site's page is not kept: it cannot prefill the form.
            now[0] += 2 * 3600
            forged = {**typed, "goal": "Forged elsewhere"}
            elsewhere = {"origin": "https://elsewhere.example"}
            assert client.post("/tasks/new", data=forged, headers=elsewhere).status_code == 303
            log_in(client, "/tasks/new")
            assert "Forged elsewhere" not in client.get("/tasks/new").text
    finally:
        server.stop()


def test_a_cancel_posted_after_the_session_expired_cancels_nothing_and_keeps_its_reason(
    console_settings: ConsoleSettings, operator: Operator
) -> None:
    """The cancel form is the other form an operator types into: posted after the session
    expired, its reason was lost with the login. It comes back with it, once, and the task
    is not cancelled until the form is posted again."""
    task = operator.submit(f"Cancel me later {uuid.uuid4().hex[:8]}", host_id="nowhere")
    now = [1000.0]
    app = create_app(console_settings)
    app.state.sessions = SessionStore(3600, clock=lambda: now[0])
    server = UvicornThread(app)
    base = server.start()
    path = f"/tasks/{task.task_id}/cancel"
    try:
        with httpx.Client(base_url=base, timeout=20) as client:
            log_in(client, path)
            token = csrf_of(client.get(path).text)
            now[0] += 2 * 3600
            own_page = {"origin": base, "referer": f"{base}{path}"}
            form = {"csrf_token": token, "reason": "wrong phone, resubmitting"}
            posted = client.post(path, data=form, headers=own_page)
            assert posted.status_code == 303 and posted.headers["location"].startswith("/login")
            assert not operator.get(task.task_id).cancel_requested
            assert log_in(client, path).headers["location"] == path
            text = unescape(client.get(path).text)
            assert 'id="cancel-restored"' in text
            assert 'value="wrong phone, resubmitting"' in text
            assert not operator.get(task.task_id).cancel_requested
            again = {"csrf_token": csrf_of(text), "reason": "wrong phone, resubmitting"}
            assert client.post(path, data=again).status_code == 303
            # A queued task ends at once.
            assert operator.get(task.task_id).status == types_pb2.TASK_STATUS_CANCELLED
    finally:
        server.stop()
