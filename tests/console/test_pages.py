"""Pages over plain HTTP: login, CSRF on every form, sessions, redirects, error pages."""

from __future__ import annotations

import re
import uuid

import httpx

from console.gateway.app import SESSION_COOKIE
from tests.console.console_stack import ADMIN, PASSWORD


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no CSRF field"
    return match.group(1)


def log_in(client: httpx.Client, next_path: str = "/tasks") -> httpx.Response:
    token = csrf_of(client.get("/login").text)
    return client.post(
        "/login",
        data={"username": ADMIN, "password": PASSWORD, "csrf_token": token, "next": next_path},
    )


def test_login_sets_an_httponly_lax_session_cookie(anon: httpx.Client) -> None:
    response = log_in(anon)
    assert response.status_code == 303
    assert response.headers["location"] == "/tasks"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "httponly" in cookie.lower()
    assert "samesite=lax" in cookie.lower()
    assert PASSWORD not in cookie
    assert anon.get("/tasks").status_code == 200


def test_wrong_password_is_refused(anon: httpx.Client) -> None:
    token = csrf_of(anon.get("/login").text)
    response = anon.post(
        "/login", data={"username": ADMIN, "password": "nope", "csrf_token": token}
    )
    assert response.status_code == 401
    assert "Wrong username or password." in response.text
    assert anon.get("/tasks").status_code == 303


def test_login_without_csrf_token_is_403(anon: httpx.Client) -> None:
    anon.get("/login")
    response = anon.post("/login", data={"username": ADMIN, "password": PASSWORD})
    assert response.status_code == 403
    assert anon.get("/tasks").status_code == 303


def test_login_never_redirects_off_site(anon: httpx.Client) -> None:
    response = log_in(anon, next_path="//evil.example/steal")
    assert response.status_code == 303
    assert response.headers["location"] == "/tasks"


def test_every_form_needs_the_csrf_token(anon: httpx.Client) -> None:
    log_in(anon)
    goal = f"forged {uuid.uuid4().hex[:8]}"
    forged = anon.post("/tasks/new", data={"goal": goal, "host_id": "nowhere"})
    assert forged.status_code == 403
    assert "CSRF" in forged.text
    assert anon.post("/tasks/x/cancel", data={"reason": "r"}).status_code == 403
    assert anon.post("/logout").status_code == 403
    wrong = anon.post("/tasks/new", data={"goal": goal, "csrf_token": "guess"})
    assert wrong.status_code == 403

    token = csrf_of(anon.get("/tasks/new").text)
    made = anon.post("/tasks/new", data={"goal": goal, "host_id": "nowhere", "csrf_token": token})
    assert made.status_code == 303
    assert made.headers["location"].startswith("/tasks/")


def test_submit_form_shows_the_cloud_refusal(anon: httpx.Client) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks/new").text)
    response = anon.post("/tasks/new", data={"goal": "", "csrf_token": token})
    assert response.status_code == 422
    assert 'class="alert"' in response.text


def test_logout_ends_the_session(anon: httpx.Client) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks").text)
    assert anon.post("/logout", data={"csrf_token": token}).status_code == 303
    assert anon.get("/tasks").status_code == 303


def test_unknown_task_page_is_404_with_the_cloud_message(anon: httpx.Client) -> None:
    log_in(anon)
    response = anon.get("/tasks/no-such-task")
    assert response.status_code == 404
    assert "NOT_FOUND" in response.text


def test_pages_carry_security_headers(anon: httpx.Client) -> None:
    response = anon.get("/login")
    assert response.headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


def test_goals_are_escaped_on_every_page(anon: httpx.Client) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks/new").text)
    goal = f"<script>alert('{uuid.uuid4().hex[:6]}')</script>"
    made = anon.post("/tasks/new", data={"goal": goal, "host_id": "nowhere", "csrf_token": token})
    detail = anon.get(made.headers["location"]).text
    listing = anon.get("/tasks", params={"q": goal}).text
    for html in (detail, listing):
        assert goal not in html
        assert "&lt;script&gt;" in html


def test_bad_form_and_query_values_get_an_html_answer(anon: httpx.Client) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks/new").text)
    response = anon.post(
        "/tasks/new", data={"goal": "g", "max_attempts": "many", "csrf_token": token}
    )
    assert response.status_code == 422
    assert "whole number" in response.text
    bad_query = anon.get("/tasks", params={"page_size": "lots"})
    assert bad_query.status_code == 422
    assert bad_query.headers["content-type"].startswith("text/html")
    assert "page_size" in bad_query.text
