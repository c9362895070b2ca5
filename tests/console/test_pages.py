"""Pages over plain HTTP: login, CSRF on every form, sessions, redirects, error pages."""

from __future__ import annotations

import datetime as dt
import io
import re
import time
import uuid
from html import unescape
from typing import Any

import httpx
from google.protobuf.duration_pb2 import Duration
from PIL import Image
from sqlalchemy import update

from amc.v1 import artifact_service_pb2, lease_service_pb2, task_service_pb2, types_pb2
from amc.v1.artifact_service_pb2_grpc import ArtifactServiceStub
from cloud.store.models import HostRow
from console.gateway import create_app
from console.gateway.app import SESSION_COOKIE
from console.settings import ConsoleSettings
from tests.console.console_stack import (
    ADMIN,
    PASSWORD,
    WHOLE_FLEET,
    Cloud,
    HostFactory,
    Operator,
    UvicornThread,
)


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
    made = anon.post(
        "/tasks/new",
        data={"goal": goal, "host_id": "nowhere", "confirmed": "nowhere/", "csrf_token": token},
    )
    assert made.status_code == 303
    assert made.headers["location"].startswith("/tasks/")


def test_submit_warns_about_an_unknown_target_before_queueing(
    anon: httpx.Client, api: httpx.Client
) -> None:
    """The cloud checks the target against the fleet: the form shows its warning and queues
    nothing until "Submit anyway" (for the same target); a malformed host is refused."""
    log_in(anon)
    token = csrf_of(anon.get("/tasks/new").text)
    goal = f"warned {uuid.uuid4().hex[:8]}"
    form = {"goal": goal, "host_id": "never-seen", "csrf_token": token}
    warned = anon.post("/tasks/new", data=form)
    assert warned.status_code == 200
    assert "host never-seen has never connected to this cloud" in warned.text
    assert "Submit anyway" in warned.text
    assert 'name="confirmed" value="never-seen/"' in warned.text
    assert api.get("/api/tasks", params={"q": goal}).json()["tasks"] == []
    # Another target is checked again; the confirmed one is queued.
    other = anon.post(
        "/tasks/new", data={**form, "host_id": "other-host", "confirmed": "never-seen/"}
    )
    assert "host other-host has never connected" in other.text
    made = anon.post("/tasks/new", data={**form, "confirmed": "never-seen/"})
    assert made.status_code == 303
    page = anon.get(made.headers["location"]).text
    assert "host never-seen has never connected" in page  # said once more on the task page
    assert "host never-seen has never connected" not in anon.get(made.headers["location"]).text
    assert [t["goal"] for t in api.get("/api/tasks", params={"q": goal}).json()["tasks"]] == [goal]
    refused = anon.post("/tasks/new", data={**form, "host_id": "bad host"})
    assert refused.status_code == 422
    assert "target.host_id: &#39;bad host&#39; is not a host id" in refused.text


def test_submit_form_shows_the_cloud_refusal(anon: httpx.Client) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks/new").text)
    response = anon.post("/tasks/new", data={"goal": "", "csrf_token": token})
    assert response.status_code == 422
    assert 'class="alert"' in response.text


def test_a_goal_holding_a_credential_is_warned_before_queueing_and_once_on_the_task_page(
    anon: httpx.Client,
) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks/new").text)
    goal = f"Join the Wi-Fi HomeNet with password hunter{uuid.uuid4().hex[:4]}7"
    form = {"goal": goal, "host_id": "nowhere", "csrf_token": token}
    checked = anon.post("/tasks/new", data=form)
    assert checked.status_code == 200  # nothing queued yet: the warnings come first
    assert "looks like it holds a credential" in checked.text
    made = anon.post("/tasks/new", data={**form, "confirmed": "nowhere/"})
    assert made.status_code == 303
    page = anon.get(made.headers["location"])
    assert 'data-field="submit-warning"' in page.text
    assert "looks like it holds a credential" in page.text and "secret" in page.text
    again = anon.get(made.headers["location"])  # said once
    assert 'data-field="submit-warning"' not in again.text


def test_logout_ends_the_session(anon: httpx.Client) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks").text)
    assert anon.post("/logout", data={"csrf_token": token}).status_code == 303
    assert anon.get("/tasks").status_code == 303


def test_login_and_logout_after_the_session_was_lost_lead_to_the_login_page(
    anon: httpx.Client,
) -> None:
    """Two tabs share one cookie: what one does to the session, the other's open form meets.
    Logging out, or in, in one tab took away the token the other tab's login or logout form
    carried, and posting it answered "403 missing or invalid CSRF token" (the other forms
    lead to the login since 1502bed). Now both lead to the login page without doing anything;
    with a live session a logout without its token is still refused."""
    login_token = csrf_of(anon.get("/login").text)  # tab A: the login page
    assert log_in(anon, "/fleet").status_code == 303  # tab B logs in
    page_token = csrf_of(anon.get("/tasks").text)  # both tabs now show a page
    assert anon.post("/logout").status_code == 403  # a logout without the token, refused
    assert anon.get("/tasks").status_code == 200

    # Tab A's login form, posted while tab B's login holds the session: on to the page.
    stale = {"username": ADMIN, "password": PASSWORD, "csrf_token": login_token, "next": "/fleet"}
    again = anon.post("/login", data=stale)
    assert again.status_code == 303, again.text
    assert again.headers["location"] == "/login?next=%2Ffleet"
    assert anon.get(again.headers["location"]).headers["location"] == "/fleet"

    assert anon.post("/logout", data={"csrf_token": page_token}).status_code == 303  # tab B
    # Tab A's logout, then its login form: the login page, and nobody is logged in by it.
    out = anon.post("/logout", data={"csrf_token": page_token})
    assert out.status_code == 303, out.text
    assert out.headers["location"] == "/login"
    back = anon.post("/login", data=stale)
    assert back.status_code == 303, back.text
    assert back.headers["location"] == "/login?next=%2Ffleet"
    assert anon.get("/tasks").status_code == 303
    assert anon.get(back.headers["location"]).status_code == 200


def test_unknown_task_page_is_404_with_the_cloud_message(anon: httpx.Client) -> None:
    log_in(anon)
    response = anon.get(f"/tasks/{'0' * 32}")
    assert response.status_code == 404
    assert "NOT_FOUND" in response.text
    response = anon.get("/tasks/no-such-task")  # not an id: said without asking the cloud
    assert response.status_code == 404
    assert "not a task id" in response.text


def test_pages_carry_security_headers(anon: httpx.Client) -> None:
    response = anon.get("/login")
    assert response.headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


def test_what_an_operator_sees_is_not_kept_by_a_cache(anon: httpx.Client) -> None:
    """Pages and API answers carry `no-store` (a shared machine's browser cache, a proxy);
    the stylesheet stays cacheable."""
    log_in(anon)
    for path in ("/tasks", "/tasks/new", "/login"):
        assert anon.get(path).headers["cache-control"] == "no-store", path
    assert "no-store" not in anon.get("/static/webui.css").headers.get("cache-control", "")


def test_assets_are_linked_by_path_so_an_https_proxy_loads_them(anon: httpx.Client) -> None:
    """The stylesheets, scripts and icon were linked by absolute URL built from the request the
    console saw: behind a TLS-terminating proxy (docs/deployment.md, the console trusts no
    forwarding headers) that was `http://…` on an `https://` page, which the browser blocks
    as mixed content (the pages unstyled and no longer live), and a proxy that sends its own
    Host sent the browser to that name. They are linked by path now."""
    login = anon.get("/login").text
    log_in(anon)
    for path, html in (("/login", login), ("/tasks", anon.get("/tasks").text)):
        linked = re.findall(r'<(?:link|script)[^>]* (?:href|src)="([^"]+)"', html)
        assert sorted(linked) == [
            "/static/console.css",
            "/static/favicon.svg",
            "/static/live.js",
            "/static/prompts.js",
            "/static/webui.css",
        ], path


def test_goals_are_escaped_on_every_page(anon: httpx.Client) -> None:
    log_in(anon)
    token = csrf_of(anon.get("/tasks/new").text)
    goal = f"<script>alert('{uuid.uuid4().hex[:6]}')</script>"
    made = anon.post(
        "/tasks/new",
        data={"goal": goal, "host_id": "nowhere", "confirmed": "nowhere/", "csrf_token": token},
    )
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
    token = csrf_of(response.text)
    beyond = {"goal": "g", "max_attempts": "99999999999", "csrf_token": token}
    too_many = anon.post("/tasks/new", data=beyond)  # more than protobuf's int32: was a 500
    assert too_many.status_code == 422
    # A whole number, only too many: the allowed range is named (it said "must be a whole
    # number", which it is).
    assert "whole number" not in too_many.text
    assert "max_attempts: 0 (default) to 20" in too_many.text
    # Digits of other scripts and underscores are not a number here (int() read "٣" and "３"
    # as 3, "1_0" as 10, and queued the task with that many attempts).
    for typed in ("\u0663", "\uff13", "1_0", "+3"):
        token = csrf_of(too_many.text)
        odd = anon.post(
            "/tasks/new", data={"goal": "g", "max_attempts": typed, "csrf_token": token}
        )
        assert odd.status_code == 422, typed
        assert "whole number" in odd.text
    bad_query = anon.get("/tasks", params={"page_size": "lots"})
    assert bad_query.status_code == 422
    assert bad_query.headers["content-type"].startswith("text/html")
    assert "page_size" in bad_query.text


def _link(html_text: str, rel: str) -> str | None:
    match = re.search(rf'<a href="([^"]+)" rel="{rel}">', html_text)
    return unescape(match.group(1)) if match else None


def _rows(html_text: str) -> list[str]:
    return re.findall(r'<tr[^>]* data-task-id="([^"]+)"', html_text)


def test_task_pages_lead_back_the_way_they_came(anon: httpx.Client, operator: Operator) -> None:
    log_in(anon)
    tag = uuid.uuid4().hex[:8]
    made = [operator.submit(f"page walk {tag} #{i}", host_id="nowhere").task_id for i in range(7)]

    forward: list[list[str]] = []
    urls: list[str] = []
    url: str | None = f"/tasks?q={tag}&page_size=2"
    while url is not None:
        page = anon.get(url)
        assert page.status_code == 200
        urls.append(url)
        forward.append(_rows(page.text))
        url = _link(page.text, "next")
    assert [len(rows) for rows in forward] == [2, 2, 2, 1]
    assert sorted(t for rows in forward for t in rows) == sorted(made)  # each task once

    # Back from the last page, one "Newer" at a time, through the same pages.
    page = anon.get(urls[-1])
    for expected in reversed(forward[:-1]):
        newer = _link(page.text, "prev")
        assert newer is not None
        assert f"q={tag}" in newer and "page_size=2" in newer  # the filters stay
        page = anon.get(newer)
        assert page.status_code == 200
        assert _rows(page.text) == expected
    assert _link(page.text, "prev") is None  # the first page
    assert "page_token" not in str(page.url)


def test_task_pages_without_a_known_way_back_offer_the_first_page(
    anon: httpx.Client, operator: Operator
) -> None:
    log_in(anon)
    tag = uuid.uuid4().hex[:8]
    for i in range(3):
        operator.submit(f"shared link {tag} #{i}", host_id="nowhere")
    first = anon.get("/tasks", params={"q": tag, "page_size": 1})
    older = _link(first.text, "next")
    assert older is not None
    token = dict(httpx.URL(older).params)["page_token"]

    shared = anon.get("/tasks", params={"q": tag, "page_size": 1, "page_token": token})
    assert shared.status_code == 200
    assert _link(shared.text, "prev") is None
    assert "« First page" in shared.text

    # An oversized trail is ignored rather than echoed into every link.
    huge = anon.get(
        "/tasks", params={"q": tag, "page_size": 1, "page_token": token, "back": "x" * 5000}
    )
    assert huge.status_code == 200
    assert _link(huge.text, "prev") is None
    assert "x" * 600 not in huge.text

    # A forged trail token reaches the cloud only when followed, which refuses it.
    forged = anon.get(
        "/tasks", params={"q": tag, "page_size": 1, "page_token": token, "back": "garbage"}
    )
    newer = _link(forged.text, "prev")
    assert newer is not None
    refused = anon.get(newer)
    assert refused.status_code == 422
    assert "INVALID_ARGUMENT" in refused.text


def test_the_fleet_page_says_why_dispatch_is_paused(
    anon: httpx.Client, api: httpx.Client, cloud: Cloud
) -> None:
    """The cloud calls its model provider down (three temporarily impossible Decides in a
    row) and holds new tasks back; the fleet page and /api/hosts say so, and stop saying it
    once the provider answers again."""
    health = cloud.server.provider_health

    async def probe() -> None:
        return None

    # The health record wakes the dispatcher's loop: it is called there, as the planner does.
    async def fail() -> None:
        health.probe = probe
        for _ in range(health.threshold):
            await health.failed("planner: Anthropic is unavailable (HTTP 529 after 2 retries: x)")

    async def recover() -> None:
        await health.succeeded()
        health.probe = None

    cloud.loop.run(fail())
    try:
        log_in(anon)
        page = unescape(anon.get("/fleet").text)
        assert "New tasks are not handed out: the model provider is unavailable since" in page
        assert "HTTP 529 after 2 retries" in page
        listed = api.get("/api/hosts").json()["dispatch"]
        assert listed["paused"] and "model provider is unavailable" in listed["reason"]
        # The hold's parts, beside the sentence (they were in the sentence only).
        replica = cloud.server.bus.replica_id
        assert listed["kind"] == "provider_down"
        assert listed["seen_by"] == replica
        assert listed["lifted_by"] == "a probe call or a Decide that succeeds"
        assert listed["since"] and listed["next_probe_at"] and listed["resumes_at"] is None
        assert 'data-field="dispatch-kind">provider down<' in page
        assert f'data-field="dispatch-seen-by">{replica}<' in page
        assert 'data-field="dispatch-lifted-by">a probe call or a Decide that succeeds<' in page
        assert 'data-field="dispatch-next-probe">' in page
    finally:
        cloud.loop.run(recover())
    assert "New tasks are not handed out" not in anon.get("/fleet").text
    assert api.get("/api/hosts").json()["dispatch"] == {
        "paused": False,
        "reason": "",
        "kind": "unspecified",
        "since": None,
        "seen_by": "",
        "lifted_by": "",
        "next_probe_at": None,
        "resumes_at": None,
    }


def _form_fields(html: str) -> dict[str, str]:
    """The hidden fields of the page's submit form, as a browser posts them."""
    form = html[html.index('<form method="post" action="/tasks/new"') :]
    form = form[: form.index("</form>")]
    return {
        unescape(name): unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)
    }


def test_a_submit_form_posted_twice_queues_one_task(anon: httpx.Client, api: httpx.Client) -> None:
    """A second click while the first answer is still on its way (a busy cloud), or the
    browser sending the post again, reached the cloud as a second submission: the form
    carried no request id, so the same goal was queued twice and ran twice on the phones.
    Each rendered form now carries its own client_request_id (kept when the form comes back
    with a warning or an error), so the cloud answers a repeat with the task it queued."""
    log_in(anon)
    goal = f"posted twice {uuid.uuid4().hex[:8]}"
    fields = {**_form_fields(anon.get("/tasks/new").text), "goal": goal, "host_id": "nowhere"}
    warned = anon.post("/tasks/new", data=fields)
    assert warned.status_code == 200 and "Submit anyway" in warned.text
    confirmed = {**_form_fields(warned.text), "goal": goal, "host_id": "nowhere"}
    first = anon.post("/tasks/new", data=confirmed)
    second = anon.post("/tasks/new", data=confirmed)
    assert first.status_code == second.status_code == 303
    assert second.headers["location"] == first.headers["location"]
    assert len(api.get("/api/tasks", params={"q": goal}).json()["tasks"]) == 1
    # A form rendered afresh is a new submission.
    again = {**_form_fields(anon.get("/tasks/new").text), "goal": goal, "host_id": "nowhere"}
    again["confirmed"] = confirmed["confirmed"]
    third = anon.post("/tasks/new", data=again)
    assert third.status_code == 303 and third.headers["location"] != first.headers["location"]


def _host_card(page: str, host_id: str) -> str:
    start = page.index(f'id="host-{host_id}"')
    return page[start : page.index("</section>", start)]


def test_a_connected_idle_host_reads_as_seen_now_not_at_its_last_message(
    anon: httpx.Client, api: httpx.Client, cloud: Cloud, make_host: HostFactory
) -> None:
    """An idle host sends nothing on its open stream (gRPC keepalives are below the messages),
    so its `last_seen_at` (its last message) stood still: a connected host read "last seen 6m
    ago" beside its green "connected". The cloud counts it connected only while the replica
    holding its stream vouches for it every heartbeat; the card says "last seen now" then,
    and the time of its last message once the stream is gone."""
    host = make_host()

    async def idle_for_six_minutes() -> None:
        six_minutes_ago = cloud.server.store.now() - dt.timedelta(minutes=6)
        async with cloud.server.store.write() as session:
            await session.execute(
                update(HostRow)
                .where(HostRow.host_id == host.host_id)
                .values(last_seen_at=six_minutes_ago)
            )

    cloud.loop.run(idle_for_six_minutes())
    log_in(anon)
    card = _host_card(anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text, host.host_id)
    assert "6m ago" not in card
    assert re.search(r'<time data-field="last-seen"[^>]*>now</time>', card), card

    host.close()
    deadline = time.monotonic() + 30
    while any(
        h["host_id"] == host.host_id
        for h in api.get("/api/hosts", params={"q": host.host_id}).json()["hosts"]
        if h["connected"]
    ):
        assert time.monotonic() < deadline, "the host still reads as connected"
        time.sleep(0.05)
    card = _host_card(anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text, host.host_id)
    assert re.search(r'<time data-field="last-seen" data-ago="[^"]+"', card), card


def test_the_fleet_page_pages_through_the_hosts(
    anon: httpx.Client, api: httpx.Client, make_host: HostFactory
) -> None:
    """The fleet page drew every host the cloud knows on one page (at fleet scale, thousands
    of cards). It pages as ListHosts does, by id, with the tasks
    page's First page / Newer / Older links."""
    for _ in range(2):
        make_host()
    listed = [h["host_id"] for h in api.get("/api/hosts?page_size=500").json()["hosts"]]
    assert len(listed) >= 2
    log_in(anon)
    seen: list[str] = []
    url = "/fleet?page_size=1"
    newer: list[str | None] = []
    while url:
        page = anon.get(url)
        assert page.status_code == 200, page.text
        cards = re.findall(r'<section class="card host [^"]*" id="host-([^"]+)"', page.text)
        assert len(cards) == 1, cards
        seen += cards
        found = re.search(r'<a href="([^"]+)" rel="prev">', page.text)
        newer.append(unescape(found.group(1)) if found else None)
        older = re.search(r'<a href="([^"]+)" rel="next">', page.text)
        url = unescape(older.group(1)) if older else ""
    assert seen == listed
    assert newer[0] is None and newer[1] == "/fleet?page_size=1"


def test_a_task_page_fragment_holds_the_steps_after_the_one_asked(
    anon: httpx.Client, operator: Operator, make_host: HostFactory
) -> None:
    """What a running task's page fetches on a live change: the attempts' cards and the
    steps of one attempt after a step, not the page with the whole log."""
    host = make_host()
    goal = f"fragment {uuid.uuid4().hex[:8]}"
    task = operator.submit(goal, host_id=host.host_id)
    assignment = host.assignment()
    made = [host.decide(assignment, goal) for _ in range(4)]
    log_in(anon)
    whole = anon.get(f"/tasks/{task.task_id}")
    part = anon.get(f"/tasks/{task.task_id}/live?attempt={assignment.attempt}&after_step=2")
    assert part.status_code == 200, part.text
    shown = re.findall(r'<details class="step" id="step-([^"]+)"', part.text)
    assert shown == [d.decision_id for d in made[2:]]
    assert f'id="attempt-{assignment.attempt}"' in part.text
    assert "<html" not in part.text and len(part.text) < len(whole.text) / 2
    bad = anon.get(f"/tasks/{task.task_id}/live?attempt=0")
    assert bad.status_code == 422


def test_a_task_page_fragment_reads_its_attempt_s_events_and_only_the_newer_screenshots(
    console_settings: ConsoleSettings, operator: Operator, make_host: HostFactory
) -> None:
    """A running task's page fetches the fragment on every live change. It read the task's
    whole lease history and the metadata of every screenshot of the attempt each time, a cost
    that grew with the task's length; it needs the attempt's card (its events) and the
    screenshots of the steps after `after_step`. The gateway's cloud client is wrapped to see
    what it read from the real cloud."""
    app = create_app(console_settings)
    server = UvicornThread(app)
    base = server.start()
    try:
        cloud = app.state.cloud
        read_events: list[task_service_pb2.LeaseEvent] = []
        read_shots: list[artifact_service_pb2.StepScreenshot] = []
        real_events, real_screenshots = cloud.events, cloud.screenshots

        async def events(*args: Any, **kwargs: Any) -> Any:
            found = await real_events(*args, **kwargs)
            read_events.extend(found)
            return found

        async def screenshots(*args: Any, **kwargs: Any) -> Any:
            found = await real_screenshots(*args, **kwargs)
            read_shots.extend(found)
            return found

        cloud.events, cloud.screenshots = events, screenshots

        host = make_host()
        goal = f"fragment reads {uuid.uuid4().hex[:8]}"
        submitted: task_service_pb2.SubmitTaskResponse = operator.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal=goal,
                target=types_pb2.TaskTarget(host_id=host.host_id),
                max_attempts=2,
                lease_duration=Duration(seconds=5),
            ),
            timeout=20,
        )
        task = submitted.task
        host.assignment()
        host.expect("revoked")  # attempt 1's lease ran out: its events are attempt 1's
        host.send(lease_service_pb2.LeaseRequest(outbox=types_pb2.OutboxBacklog()))
        second = host.assignment()
        assert second.attempt == 2
        artifacts = ArtifactServiceStub(host.channel)
        for _ in range(4):
            decision = host.decide(second, goal)
            for phase in (
                artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
                artifact_service_pb2.SCREENSHOT_PHASE_AFTER,
            ):
                artifacts.UploadStepScreenshot(
                    artifact_service_pb2.UploadStepScreenshotRequest(
                        task_id=second.task_id,
                        attempt=second.attempt,
                        lease_id=second.lease_id,
                        decision_id=decision.decision_id,
                        phase=phase,
                        content_type="image/png",
                        data=_png(),
                    ),
                    timeout=20,
                )

        with httpx.Client(base_url=base, timeout=20) as client:
            log_in(client)
            part = client.get(f"/tasks/{task.task_id}/live?attempt=2&after_step=3")
        assert part.status_code == 200, part.text
        assert 'id="attempt-2"' in part.text
        assert f"/api/tasks/{task.task_id}/attempts/2/steps/4/screens/before" in part.text
        assert read_events and {e.attempt for e in read_events} == {2}
        assert sorted((s.step_index, s.phase) for s in read_shots) == [
            (4, artifact_service_pb2.SCREENSHOT_PHASE_BEFORE),
            (4, artifact_service_pb2.SCREENSHOT_PHASE_AFTER),
        ]
    finally:
        server.stop()


def _png() -> bytes:
    image = io.BytesIO()
    Image.new("RGB", (108, 240), "navy").save(image, format="PNG")
    return image.getvalue()


def test_a_step_whose_outcome_never_came_reads_as_never_reported_once_its_attempt_ended(
    anon: httpx.Client, operator: Operator, make_host: HostFactory
) -> None:
    """A host that acted on a decision and then stopped (killed, its lease lost) never reports
    what the action did: while the attempt runs the outcome may still come ("not reported
    yet"); once it has ended, it never will, and the step says so."""
    host = make_host()
    goal = f"outcome {uuid.uuid4().hex[:8]}"
    task = operator.submit(goal, host_id=host.host_id, max_attempts=1)
    assignment = host.assignment()
    made = host.decide(assignment, goal)
    assert made.tool_name != "complete"
    log_in(anon)

    def outcome() -> str:
        page = anon.get(f"/tasks/{task.task_id}")
        assert page.status_code == 200, page.text
        step = page.text.split(f'id="step-{made.decision_id}"', 1)[1]
        said = re.search(r'data-field="outcome">([^<]*)<', step)
        assert said is not None, step[:2000]
        return unescape(said.group(1))

    assert outcome() == "not reported yet"
    host.finish(assignment, types_pb2.TASK_STATUS_FAILED, "the phone went away")
    assert (
        outcome()
        == "never reported: the attempt ended before its host reported what the action did"
    )


def test_an_unknown_status_filter_shows_no_tasks_and_names_the_allowed_ones(
    anon: httpx.Client, operator: Operator
) -> None:
    """`/tasks?status=bogus` dropped the unknown word and listed every task, as if they were
    the ones filtered for (a mistyped or outdated link read as "all of these are bogus"). It
    is refused as the API refuses it (422), listing no task, naming the allowed statuses and
    keeping the rest of the filter."""
    operator.submit(
        f"Listed unless the filter is refused {uuid.uuid4().hex[:8]}", host_id="nowhere"
    )
    log_in(anon)
    assert _rows(anon.get("/tasks").text)
    for query in ({"status": "bogus"}, {"status": ["queued", "bogus"], "q": "Listed"}):
        page = anon.get("/tasks", params=query)
        assert page.status_code == 422, page.text
        text = unescape(page.text)
        assert "Unknown status 'bogus'" in text
        assert "queued, assigned, running, succeeded, failed, cancelled" in text
        assert _rows(page.text) == []
        assert "data-live=" not in text  # no live refresh fills the table behind the message
    assert 'value="queued" checked' in text and 'value="Listed"' in text


def test_an_ambiguous_task_id_prefix_names_the_tasks_it_could_be(
    anon: httpx.Client, operator: Operator
) -> None:
    """A unique prefix of a task id leads to the task; one that several tasks share answered
    the cloud's "task … not found", as if no task had that id. It says it is ambiguous and
    names the first few; a whole unknown id is still the cloud's own 404."""
    made = [operator.submit(f"Prefix {uuid.uuid4().hex[:8]}", host_id="nowhere") for _ in range(17)]
    ids = [t.task_id for t in made]
    shared = next(i[0] for i in ids if sum(j[0] == i[0] for j in ids) > 1)  # 17 ids, 16 digits
    log_in(anon)
    several = anon.get(f"/tasks/{shared}")
    assert several.status_code == 404, several.text
    text = unescape(several.text)
    assert f"task id prefix {shared} is ambiguous: " in text
    assert "give more characters of the id" in text
    assert sum(i in text for i in ids if i.startswith(shared)) >= 2
    one = anon.get(f"/tasks/{ids[0][:31]}")
    assert (one.status_code, one.headers["location"]) == (307, f"/tasks/{ids[0]}")
    whole = anon.get(f"/tasks/{'0' * 31}f")
    assert whole.status_code == 404 and "NOT_FOUND" in whole.text


def test_a_whole_task_id_in_capitals_leads_to_the_task(
    anon: httpx.Client, operator: Operator
) -> None:
    """A task id is hexadecimal, which some tools write in capitals; its prefixes were taken
    in any case (and `amc task …` and "Submit again" take the whole id so), but the whole id
    in capitals answered the cloud's "task … not found" for a task that exists."""
    task = operator.submit(f"Capitals {uuid.uuid4().hex[:8]}", host_id="nowhere")
    log_in(anon)
    upper = anon.get(f"/tasks/{task.task_id.upper()}")
    assert (upper.status_code, upper.headers.get("location")) == (307, f"/tasks/{task.task_id}")
    unknown = anon.get(f"/tasks/{'0' * 31}F")
    assert unknown.status_code == 404 and f"no task id starts with {'0' * 31}f" in unknown.text


def test_submit_again_with_what_is_not_a_task_id_is_a_short_422(anon: httpx.Client) -> None:
    """`/tasks/new?again=` went to the cloud with any text, and its 404 repeated the text
    back, 5,000 characters of it for a long one. What cannot be a task id is refused before
    asking the cloud, in a short answer that does not echo it; an id of the right shape the
    cloud does not know stays the cloud's 404."""
    log_in(anon)
    junk = "x" * 5_000
    refused = anon.get("/tasks/new", params={"again": junk})
    assert refused.status_code == 422
    assert "is not a task id" in refused.text
    assert "x" * 40 not in refused.text
    unknown = anon.get("/tasks/new", params={"again": "f" * 32})
    assert unknown.status_code == 404
    assert "NOT_FOUND" in unknown.text
    page = anon.get(f"/tasks/{junk}")  # the task page said the cloud's 404, the text in it
    assert page.status_code == 404
    assert "not a task id" in page.text
    assert "x" * 40 not in page.text


def test_submit_again_takes_a_unique_prefix_of_the_task_id(
    anon: httpx.Client, operator: Operator
) -> None:
    """The task page takes a unique prefix of an id (as a terminal shows it), but "Submit
    again" with the same prefix went to GetTask and came back as the cloud's plain 404. It
    fills the form from the one task the prefix names; a prefix no task has says so."""
    goal = f"Submitted again by prefix {uuid.uuid4().hex[:8]}"
    task = operator.submit(goal, host_id="nowhere")
    log_in(anon)
    for given in (task.task_id[:12], f" {task.task_id.upper()} "):
        form = anon.get("/tasks/new", params={"again": given})
        assert form.status_code == 200, form.text
        assert goal in unescape(form.text)
    missing = next(p for p in ("0000000000000", "fffffffffffff") if not task.task_id.startswith(p))
    none = anon.get("/tasks/new", params={"again": missing})
    assert none.status_code == 404
    assert f"no task id starts with {missing}" in unescape(none.text)


def test_the_fleet_page_lists_connected_or_disconnected_hosts(
    anon: httpx.Client, api: httpx.Client, make_host: HostFactory
) -> None:
    """At fleet scale the fleet page's order by id scatters the hosts that are down among
    the others: its filter form's Connection select lists just those (or those up), the
    choice kept in the pager's links, the select showing it, for live.js the pager too."""
    up, down = make_host(), make_host()
    down.close()
    deadline = time.monotonic() + 30
    while any(
        h["connected"] for h in api.get("/api/hosts", params={"q": down.host_id}).json()["hosts"]
    ):
        assert time.monotonic() < deadline, "the closed host still reads as connected"
        time.sleep(0.05)
    log_in(anon)
    for connection, mine, other in (("disconnected", down, up), ("connected", up, down)):
        url = f"/fleet?connection={connection}&page_size=2"
        seen: list[tuple[str, str]] = []
        while url:
            page = anon.get(url)
            assert page.status_code == 200, page.text
            assert f'<option value="{connection}" selected>' in page.text
            assert f'data-connection="{connection}"' in page.text
            seen += re.findall(r'<section class="card host ([^"]*)" id="host-([^"]+)"', page.text)
            older = re.search(r'<a href="([^"]+)" rel="next">', page.text)
            url = unescape(older.group(1)) if older else ""
            if url:
                assert f"connection={connection}" in url, url
        ids = [h for _, h in seen]
        assert {state for state, _ in seen} == {connection}, seen
        assert mine.host_id in ids and other.host_id not in ids
        assert ids == sorted(ids)
    bad = anon.get("/fleet?connection=down")
    assert bad.status_code == 422
