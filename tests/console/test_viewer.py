"""The console's viewer login and token: every page and read, no change.

Proves: every route of the app that may change something (any method but GET/HEAD/OPTIONS;
found from the app's own routes, so a route added later is covered) answers a viewer 403 with
the viewer refusal, over its session (with a valid CSRF token, as a real form or script sends)
and, for the JSON API, over its bearer token, while the operator's task and flow it aimed at
stay as they were; a viewer reads the API and sees the pages without their submit, cancel and
flow controls (the forms' own pages refuse it); the settings refuse a viewer login that could
be mistaken for the operator's.

Real parts: the real cloud (mTLS, SQLite) and the console under uvicorn (`gateway`), httpx.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from html import unescape
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from pydantic import SecretStr, ValidationError

from amc.v1 import types_pb2
from console.gateway import create_app
from console.gateway.auth import Credentials
from console.gateway.roles import OPEN_POSTS, VIEWER_REFUSAL
from console.settings import ConsoleSettings
from tests.console.console_stack import (
    ADMIN,
    API_TOKEN,
    PASSWORD,
    VIEWER,
    VIEWER_PASSWORD,
    VIEWER_TOKEN,
    Cloud,
    Operator,
)
from tests.console.test_flows_console import _flow
from tests.console.test_pages import csrf_of

SAFE = {"GET", "HEAD", "OPTIONS"}
#: What each known change route is sent (a body its route would act on, were it not refused);
#: a route not listed here gets an empty one, and must still be refused.
FORMS: dict[str, dict[str, str]] = {
    "/tasks/new": {"goal": "Typed by a viewer", "max_attempts": "1"},
    "/tasks/{task_id}/cancel": {"reason": "a viewer tried"},
    "/flows/{flow_id}/status": {"active": "0"},
}
BODIES: dict[str, dict[str, Any]] = {
    "/api/tasks": {"goal": "Sent by a viewer", "max_attempts": 1},
    "/api/tasks/{task_id}/cancel": {"reason": "a viewer tried"},
    "/api/flows/{flow_id}/status": {"active": False, "reason": "a viewer tried"},
}


def _log_in(client: httpx.Client, username: str, password: str) -> str:
    """Log `client` in; returns the session's CSRF token."""
    token = csrf_of(client.get("/login").text)
    done = client.post(
        "/login",
        data={"username": username, "password": password, "csrf_token": token, "next": "/tasks"},
    )
    assert done.status_code == 303, done.text
    return csrf_of(client.get("/tasks").text)


@pytest.fixture
def viewer(gateway: str) -> Iterator[tuple[httpx.Client, str]]:
    """A client logged in with the viewer login, and its CSRF token."""
    with httpx.Client(base_url=gateway, timeout=20) as client:
        yield client, _log_in(client, VIEWER, VIEWER_PASSWORD)


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every route under `routes`. FastAPI 0.16x keeps an included router
    whole (its `original_router`, under its include's prefix) rather than copying its routes
    into the app's list, and has no public way to list them all; older versions copy them."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix + route.path, set(route.methods or ())
        elif hasattr(route, "original_router"):
            below = prefix + route.include_context.prefix
            yield from _routes(route.original_router.routes, below)


def _changes(console_settings: ConsoleSettings) -> list[tuple[str, str]]:
    """(method, path template) of every route of the console app that may change something."""
    app = create_app(console_settings)
    found = [
        (method, path)
        for path, methods in _routes(list(app.routes))
        for method in sorted(methods - SAFE)
        if path not in OPEN_POSTS
    ]
    assert found, "the app has no route that changes anything?"
    return found


def test_logging_in_and_out_are_the_only_posts_open_to_viewers() -> None:
    assert {"/login", "/logout"} == OPEN_POSTS


def test_every_change_route_refuses_a_viewer(
    viewer: tuple[httpx.Client, str],
    gateway: str,
    console_settings: ConsoleSettings,
    operator: Operator,
    cloud: Cloud,
) -> None:
    client, csrf = viewer
    task = operator.submit(f"Queued for a viewer to leave alone {uuid.uuid4().hex[:8]}")
    flow_id = _flow(cloud)
    values = {"task_id": task.task_id, "flow_id": flow_id}
    tried = []
    with httpx.Client(
        base_url=gateway, timeout=20, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}
    ) as token_client:
        for method, template in _changes(console_settings):
            path = re.sub(r"{(\w+)}", lambda m: values.get(m.group(1), "x"), template)
            if template.startswith("/api"):
                body = BODIES.get(template, {})
                answers = [
                    client.request(method, path, json=body, headers={"X-CSRF-Token": csrf}),
                    token_client.request(method, path, json=body),
                ]
                for answer in answers:
                    assert answer.status_code == 403, (method, path, answer.text)
                    assert answer.json() == {"detail": VIEWER_REFUSAL}
            else:
                form = {**FORMS.get(template, {}), "csrf_token": csrf}
                answer = client.request(method, path, data=form)
                assert answer.status_code == 403, (method, path, answer.text)
                assert VIEWER_REFUSAL in unescape(answer.text)
            tried.append((method, template))
    assert ("POST", "/api/tasks") in tried and ("POST", "/tasks/{task_id}/cancel") in tried
    # Nothing the viewer aimed at changed: the task is queued, the flow active, and no task
    # with a viewer's goal was queued.
    assert operator.get(task.task_id).status == types_pb2.TASK_STATUS_QUEUED
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.Client(base_url=gateway, timeout=20, headers=headers) as api:
        assert api.get(f"/api/flows/{flow_id}").json()["status"] == "active"
        for goal in ("Typed by a viewer", "Sent by a viewer"):
            assert api.get("/api/tasks", params={"q": goal}).json()["tasks"] == []
        # The same route, for the operator's token, does what the viewer's could not.
        cancelled = api.post(f"/api/tasks/{task.task_id}/cancel", json={"reason": "done"})
        assert cancelled.status_code == 200, cancelled.text


def test_a_viewer_reads_the_api_with_its_token_or_session(
    viewer: tuple[httpx.Client, str], gateway: str, operator: Operator
) -> None:
    client, _ = viewer
    task = operator.submit(f"Watched by a viewer {uuid.uuid4().hex[:8]}")
    headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    with httpx.Client(base_url=gateway, timeout=20, headers=headers) as token_client:
        for reader in (client, token_client):
            for path in (f"/api/tasks/{task.task_id}", "/api/tasks", "/api/hosts", "/api/flows"):
                answer = reader.get(path)
                assert answer.status_code == 200, (path, answer.text)
            assert reader.get(f"/api/tasks/{task.task_id}").json()["task"]["goal"] == task.goal


def test_a_viewer_sees_the_pages_without_their_controls(
    viewer: tuple[httpx.Client, str], gateway: str, operator: Operator, cloud: Cloud
) -> None:
    client, _ = viewer
    task = operator.submit(f"Shown to a viewer {uuid.uuid4().hex[:8]}")
    flow_id = _flow(cloud)
    with httpx.Client(base_url=gateway, timeout=20) as admin:
        _log_in(admin, ADMIN, PASSWORD)
        pages = {
            "tasks": "/tasks",
            "task": f"/tasks/{task.task_id}",
            "flow": f"/flows/{flow_id}",
            "fleet": "/fleet",
        }
        seen = {name: client.get(path) for name, path in pages.items()}
        operators = {name: admin.get(path) for name, path in pages.items()}
    for name, answer in seen.items():
        assert answer.status_code == 200, (name, answer.text)
        assert 'href="/tasks/new' not in answer.text, name
        assert "(viewer)" in answer.text
        assert "(viewer)" not in operators[name].text
    # What the operator sees on the same pages, and the viewer does not.
    assert 'href="/tasks/new"' in operators["tasks"].text
    assert 'data-field="cancel"' in operators["task"].text
    assert 'data-field="cancel"' not in seen["task"].text
    assert f'action="/flows/{flow_id}/status"' in operators["flow"].text
    assert f'action="/flows/{flow_id}/status"' not in seen["flow"].text
    # The forms' own pages, asked for directly, refuse a viewer as their posts do.
    for path in ("/tasks/new", f"/tasks/new?again={task.task_id}", f"/tasks/{task.task_id}/cancel"):
        answer = client.get(path)
        assert answer.status_code == 403, (path, answer.text)
        assert VIEWER_REFUSAL in unescape(answer.text)
        assert 'name="goal"' not in answer.text


def test_credentials_tell_the_viewer_from_the_operator() -> None:
    creds = Credentials(
        "admin",
        SecretStr("s3cret"),
        SecretStr("token-0123456789abcdef"),
        viewer=("dana", SecretStr("w4tch")),
        viewer_token=SecretStr("viewer-0123456789abcdef"),
    )
    assert creds.login_role("admin", "s3cret") == "operator"
    assert creds.login_role("dana", "w4tch") == "viewer"
    assert creds.login_role("dana", "s3cret") is None
    assert creds.login_role("admin", "w4tch") is None
    assert creds.token_role("token-0123456789abcdef") == "operator"
    assert creds.token_role("viewer-0123456789abcdef") == "viewer"
    assert creds.token_role("viewer-0123456789abcdeF") is None
    assert (creds.role_of("admin"), creds.role_of("dana")) == ("operator", "viewer")
    no_viewer = Credentials("admin", SecretStr("s3cret"), None)
    assert no_viewer.role_of("dana") == "operator"
    assert no_viewer.token_role("viewer-0123456789abcdef") is None


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            {"viewer_username": "dana"},
            "AMC_CONSOLE_VIEWER_USERNAME and AMC_CONSOLE_VIEWER_PASSWORD",
        ),
        (
            {"viewer_password": "w4tch"},
            "AMC_CONSOLE_VIEWER_USERNAME and AMC_CONSOLE_VIEWER_PASSWORD",
        ),
        ({"viewer_username": "dana", "viewer_password": ""}, "must not be empty"),
        ({"viewer_username": "admin", "viewer_password": "w4tch"}, "must differ"),
        ({"viewer_api_token": "short"}, "at least 16 characters"),
        (
            {"api_token": "token-0123456789abcdef", "viewer_api_token": "token-0123456789abcdef"},
            "AMC_CONSOLE_VIEWER_API_TOKEN must differ from AMC_CONSOLE_API_TOKEN",
        ),
    ],
)
def test_settings_refuse_a_viewer_login_that_is_not_one(
    settings: dict[str, str], says: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)):
        ConsoleSettings(admin_username="admin", admin_password="s3cret", **settings)  # type: ignore[arg-type]
