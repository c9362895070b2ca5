"""The host console over HTTP: login with the one-time token, sessions, CSRF, every page, the
artifact route's confinement, older records and masked secrets.

Starlette's TestClient drives the real app (the real store, filled by the real agent loop);
the served-in-a-loop and browser tests are in the other files.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markupsafe import escape as html_escape

from amc.v1 import types_pb2
from export.bundle import read_bundle
from host.console import HostConsoleSettings, create_app
from host.devices.registry import DeviceInfo
from host.timeline.record import TimelineRecord
from host.timeline.store import TimelineStore
from planner.decision import Billed, ResumedFrom, Usage
from planner.describe import describe
from tests.host.console.host_console_support import (
    LEGACY_GOAL,
    SECRET,
    T_DARK,
    T_LEGACY,
    T_SECRET,
    Filled,
    StoreOnly,
    csrf_of,
    log_in,
)
from webui.limits import MAX_BODY_BYTES, TOO_LARGE

BASE = "http://127.0.0.1"


@pytest.fixture
def anon(filled: Filled) -> Iterator[TestClient]:
    """A client with no session (redirects not followed)."""
    app = create_app(filled.state)
    with TestClient(app, base_url=BASE, follow_redirects=False) as client:
        yield client


@pytest.fixture
def client(anon: TestClient) -> TestClient:
    """A logged-in client."""
    token = cast(FastAPI, anon.app).state.login_token.current  # create_app's app
    response = log_in(anon, token)
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/now"
    return anon


def _imgs(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


@pytest.mark.parametrize(
    "path",
    ["/", "/now", "/tasks", f"/tasks/{T_DARK}", f"/artifacts/{T_DARK}-a1/step001-before.png"],
)
def test_no_session_redirects_to_login(anon: TestClient, path: str) -> None:
    response = anon.get(path)
    assert response.status_code == 303
    location = response.headers["location"]
    assert location.startswith("/login?next=")
    assert anon.get(location).status_code == 200


def test_live_fragment_without_session_is_401_not_a_redirect(anon: TestClient) -> None:
    assert anon.get("/now/phones").status_code == 401


def test_login_token_works_once_and_sets_a_strict_httponly_cookie(anon: TestClient) -> None:
    tokens = cast(FastAPI, anon.app).state.login_token  # create_app's app
    first = tokens.current
    response = log_in(anon, first)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert anon.get("/now").status_code == 200
    assert tokens.current != first  # consumed: a fresh one is logged for the next login

    # The same token in a new browser no longer works.
    with TestClient(anon.app, base_url=BASE, follow_redirects=False) as other:
        again = log_in(other, first)
        assert again.status_code == 401
        assert "not valid" in again.text
        assert other.get("/now").status_code == 303


def test_wrong_token_is_refused(anon: TestClient) -> None:
    response = log_in(anon, "not-the-token")
    assert response.status_code == 401
    assert anon.get("/now").status_code == 303


def test_login_form_prefills_a_token_from_the_printed_url(anon: TestClient) -> None:
    page = anon.get("/login", params={"token": "abc123"})
    assert 'value="abc123"' in page.text


def test_post_without_csrf_is_403(anon: TestClient) -> None:
    token = cast(FastAPI, anon.app).state.login_token.current  # create_app's app
    anon.get("/login")
    assert anon.post("/login", data={"token": token}).status_code == 403
    assert anon.post("/login", data={"token": token, "csrf_token": "forged"}).status_code == 403
    assert anon.get("/now").status_code == 303  # and the token was not spent
    assert log_in(anon, token).status_code == 303
    assert anon.post("/logout").status_code == 403
    assert anon.get("/now").status_code == 200  # still logged in


def test_logout_with_csrf_ends_the_session(client: TestClient) -> None:
    csrf = csrf_of(client.get("/now").text)
    response = client.post("/logout", data={"csrf_token": csrf})
    assert response.status_code == 303
    assert client.get("/now").status_code == 303


def test_login_next_stays_on_this_site(anon: TestClient) -> None:
    token = cast(FastAPI, anon.app).state.login_token.current  # create_app's app
    csrf = csrf_of(anon.get("/login").text)
    response = anon.post(
        "/login", data={"token": token, "csrf_token": csrf, "next": "//evil.example/x"}
    )
    assert response.headers["location"] == "/now"


def test_pages_carry_security_headers(client: TestClient) -> None:
    response = client.get("/tasks")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["cache-control"] == "no-store"  # what ran here, kept by no cache
    assert "no-store" not in client.get("/static/webui.css").headers.get("cache-control", "")


def test_assets_are_linked_by_path_so_an_https_proxy_loads_them(client: TestClient) -> None:
    """As the cloud console's (tests/console/test_pages.py): linked by absolute URL, the
    assets were `http://…` behind a TLS-terminating proxy, blocked as mixed content."""
    for path in ("/now", "/tasks", f"/tasks/{T_DARK}"):
        html = client.get(path).text
        linked = re.findall(r'<(?:link|script)[^>]* (?:href|src)="([^"]+)"', html)
        assert sorted(linked) == [
            "/static/favicon.svg",
            "/static/host-console.css",
            "/static/host-console.js",
            "/static/prompts.js",
            "/static/webui.css",
        ], path


def test_tasks_lists_every_task_that_ran_here(client: TestClient) -> None:
    page = client.get("/tasks")
    assert page.status_code == 200
    for task_id in (T_DARK, T_SECRET, T_LEGACY):
        assert f'data-task-id="{task_id}"' in page.text
    assert "Turn on dark theme" in page.text
    assert "dark theme is on" in page.text  # the result summary
    assert "succeeded" in page.text


def test_free_text_takes_its_direction_from_its_text(client: TestClient) -> None:
    """A goal, purpose, expected outcome, rationale or thinking in Arabic or Hebrew was laid
    out left to right (nothing said its direction): each free-text element now says
    dir="auto", so the browser reads its direction from the text, as the cloud console does
    (proved there in a browser: tests/console/test_browser_live.py)."""
    tasks = client.get("/tasks").text
    assert f'<a href="/tasks/{T_DARK}?attempt=1" dir="auto">Turn on dark theme</a>' in tasks
    html = client.get(f"/tasks/{T_DARK}").text
    assert '<h1 dir="auto">Turn on dark theme</h1>' in html
    section = html[html.index('id="step-3"') : html.index('id="step-4"')]
    for field in ("purpose", "expected", "rationale"):
        assert re.search(rf'<dd[^>]* data-field="{field}" dir="auto">', section), field
    assert '<pre class="prose" dir="auto">' in section  # the readable thinking block


def test_timeline_shows_each_step_with_before_and_after(client: TestClient, filled: Filled) -> None:
    page = client.get(f"/tasks/{T_DARK}")
    assert page.status_code == 200
    html = page.text
    records = filled.store.steps(T_DARK, 1)
    assert [r.tool_name for r in records] == [
        "launch_app",
        "get_ui_tree",
        "tap",
        "tap",
        "complete",
    ]
    assert html.count('class="step card"') == len(records)
    tap = records[2]
    section = html[html.index('id="step-3"') : html.index('id="step-4"')]
    assert f'<img src="/artifacts/{tap.before_screenshot_path}"' in section
    assert f'<img src="/artifacts/{tap.after_screenshot_path}"' in section
    assert "tap &#39;Display&#39;" in section
    assert "open display settings" in section  # purpose
    assert "Display page shows" in section  # expected outcome
    assert "Step 3: open display settings." in section  # rationale
    assert "redacted — the provider returned this block encrypted" in section
    assert "the row is there" in section  # the readable thinking block beside it
    assert "omitted by the provider: it returned no text for this block" in section
    assert "Thinking · summarized thinking (3 blocks)" in section
    assert '<td colspan="3" data-field="step-cost">$0.1250' in section  # what the step cost
    tokens = sum(r.usage.get("input_tokens", 0) + r.usage.get("output_tokens", 0) for r in records)
    assert f'<dd data-field="cost">{int(tokens):,} tokens · $0.1250</dd>' in html  # the attempt
    # The prompts are a link the step loads when opened, not inline (a long attempt's page
    # grew by kilobytes a step); their own page holds the real user and system prompts.
    assert "Android phone" not in html
    prompts_url = f"/tasks/{T_DARK}/attempts/1/steps/3/prompts"
    assert f'data-src="{prompts_url}"' in section
    prompts = client.get(prompts_url)
    assert prompts.status_code == 200
    assert "Turn on dark theme" in prompts.text  # the real user prompt
    assert "Android phone" in prompts.text  # the real system prompt
    assert "scripted-1" in section  # the model's answer: which model
    assert "&#34;element_id&#34;" in section  # … and its tool call
    assert "OCR before" in section
    assert "Display" in section
    for src in _imgs(section):
        shot = client.get(src)
        assert shot.status_code == 200
        assert shot.headers["content-type"] == "image/png"
        assert shot.content.startswith(b"\x89PNG")


def test_get_ui_tree_renders_as_a_tree_with_the_full_json(
    client: TestClient, filled: Filled
) -> None:
    html = client.get(f"/tasks/{T_DARK}").text
    section = html[html.index('id="step-2"') : html.index('id="step-3"')]
    assert 'class="ui-tree"' in section
    assert '<ul class="tree">' in section
    nodes = filled.store.steps(T_DARK, 1)[1].result["nodes"]
    assert nodes
    # The full JSON sits below the tree, every node in it.
    full = section[section.index("tree-json") :]
    for node in nodes[:5]:
        assert f"&#34;id&#34;: &#34;{node['id']}&#34;" in full
    # Nodes nest by bounds: the screen-filling root holds the rest.
    assert section.count("<details><summary>") >= 1
    assert "same screen" in section  # get_ui_tree does not change the screen


def test_sensitive_input_shows_as_dots_and_never_in_clear(client: TestClient) -> None:
    html = client.get(f"/tasks/{T_SECRET}").text
    assert "•••" in html
    assert SECRET not in html
    assert "type •••" in html
    for step in range(1, 5):  # nor in any step's prompts
        prompts = client.get(f"/tasks/{T_SECRET}/attempts/1/steps/{step}/prompts")
        assert prompts.status_code == 200 and SECRET not in prompts.text


def test_legacy_records_render(client: TestClient, filled: Filled) -> None:
    page = client.get(f"/tasks/{T_LEGACY}")
    assert page.status_code == 200
    html = page.text
    assert LEGACY_GOAL in html
    assert "An older record" in client.get(f"/tasks/{T_LEGACY}/attempts/1/steps/1/prompts").text
    assert "launch com.android.calculator2" in html
    assert "Fields of an older record format" in html
    legacy = filled.store.steps(T_LEGACY, 1)[0]
    assert f'<img src="/artifacts/{legacy.after_screenshot_path}"' in html
    assert client.get(f"/artifacts/{legacy.after_screenshot_path}").status_code == 200
    assert 'id="step-2"' in html  # a record with nothing in it still renders


def test_unknown_task_and_attempt_are_404(client: TestClient) -> None:
    assert client.get("/tasks/nope").status_code == 404
    assert client.get(f"/tasks/{T_DARK}", params={"attempt": 9}).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/artifacts/../task_progress.sqlite3",
        "/artifacts/%2e%2e/task_progress.sqlite3",
        "/artifacts/..%2ftask_progress.sqlite3",
        f"/artifacts/{T_DARK}-a1/..%2f..%2ftask_progress.sqlite3",
        "/artifacts/%2fetc%2fpasswd",
        "/artifacts//etc/passwd",
        "/artifacts/..%5c..%5cetc%5cpasswd",
        "/artifacts/missing.png",
        "/artifacts/",
        "/artifacts/x%00.png",
        f"/artifacts/{T_DARK}-a1/step001-before.png%00",
        "/artifacts/" + "a" * 5000 + ".png",
        "/artifacts/" + "/".join(["d" * 200] * 30) + ".png",
    ],
)
def test_artifact_route_never_leaves_the_folder(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code in (404, 303), (path, response.status_code)
    assert not response.content.startswith(b"SQLite")
    assert b"root:" not in response.content


def test_artifact_route_refuses_symlinks_out_and_non_images(
    client: TestClient, filled: Filled, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"\x89PNG secret outside the folder")
    root = filled.store.artifacts.root
    link = root / f"{T_DARK}-a1" / "escape.png"
    link.symlink_to(outside)
    note = root / f"{T_DARK}-a1" / "notes.txt"
    note.write_text("not a screenshot")
    try:
        assert client.get(f"/artifacts/{T_DARK}-a1/escape.png").status_code == 404
        assert client.get(f"/artifacts/{T_DARK}-a1/notes.txt").status_code == 404
    finally:
        link.unlink()
        note.unlink()


def test_a_login_body_past_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """Past MAX_BODY_BYTES a body is 413, as on the operators' console (a form was stopped
    only by Starlette's 1 MiB per field: a 400 saying nothing of size), on the error page."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            big = c.post("/login", data={"token": "t" * MAX_BODY_BYTES})
            assert big.status_code == 413, big.text
            # The console's error page, as for any other error (it was Starlette's plain text).
            assert big.headers["content-type"].startswith("text/html")
            assert "<h1>413" in big.text and TOO_LARGE in big.text
            assert log_in(c, app.state.login_token.current).status_code == 303
    finally:
        store.close()


@pytest.mark.parametrize(
    ("text", "sensitive"),
    [("{{ secret:pin }}", True), ("{{secret:pin}}", True), ("PIN {{secret:pin}}", True),
     ("hello there", False)],
)  # fmt: skip
def test_a_typing_step_is_worded_as_the_cloud_words_it(
    tmp_path: Path, text: str, sensitive: bool
) -> None:
    """One wording (`planner.describe.typed_text`): the host console said
    `type '{{ secret:pin }}'` (quoted, the model's spaces kept) where the cloud console, the
    progress line and exports say `type {{secret:pin}}`."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("typed", 1, "unlock", "emulator-5554")
        store.append_step(
            TimelineRecord(
                "typed",
                1,
                1,
                tool_name="input_text",
                arguments={"text": text, "sensitive": sensitive},
                action={"input_text": {"text": text, "sensitive": sensitive}},
            )
        )
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/tasks/typed").text
    finally:
        store.close()
    typed = types_pb2.Action(input_text=types_pb2.InputTextAction(text=text, sensitive=sensitive))
    line = html_escape(describe(typed))
    assert f'<span class="line">{line}</span>' in html, re.findall(r'class="line">[^<]*', html)


def test_a_step_resumed_from_a_kept_answer_is_marked_on_the_timeline(tmp_path: Path) -> None:
    """A direct-transport decision that went on from a model answer its session kept before a
    write failed (the provider sent no turn id) is marked on its step, with where the answer
    is; the step after it, which asked the model, is not. Before, nothing marked it."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("kept", 1, "open Display", "emulator-5554")
        store.append_step(
            TimelineRecord(
                "kept",
                1,
                1,
                tool_name="tap",
                resumed_from={
                    "turn_id": "",
                    "position": 4,
                    "answered_at": "2026-03-04T05:06:07+00:00",
                },
            )
        )
        store.append_step(TimelineRecord("kept", 1, 2, tool_name="tap"))
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/tasks/kept").text
    finally:
        store.close()
    assert html.count('data-field="resumed"') == 1
    answered = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    assert html_escape(ResumedFrom("", 4, answered).words()) in html
    assert "answered at 2026-03-04 05:06:07 UTC" in html


def test_a_record_holding_a_secret_in_clear_still_shows_dots(tmp_path: Path) -> None:
    """Whatever wrote the record, a sensitive input's text never reaches the page."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("raw", 1, "log in", "emulator-5554")
        store.append_step(
            TimelineRecord(
                "raw",
                1,
                1,
                tool_name="input_text",
                arguments={"text": "pa55word-in-clear", "sensitive": True},
                action={"input_text": {"text": "pa55word-in-clear", "sensitive": True}},
            )
        )
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/tasks/raw").text
        assert "pa55word-in-clear" not in html
        assert "type •••" in html
    finally:
        store.close()


def test_a_deeply_nested_screen_still_renders_its_timeline(tmp_path: Path) -> None:
    """The UI tree nests each element under the smallest earlier one whose bounds hold it, and
    the page draws the nesting with a recursive template: a screen of 300 elements each inside
    the last (a web page's nested boxes, 1 px of padding each) ran past Python's recursion
    limit, and the task's whole timeline was a 500. Nesting stops at `MAX_TREE_DEPTH`; the
    deeper elements are listed at that depth, none left out."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    elements = [
        {
            "element_id": f"e{i}",
            "text": f"box {i}",
            "bounds": {"left": i, "top": i, "right": 1080 - i, "bottom": 2400 - i},
        }
        for i in range(300)
    ]
    screen = {"elements": elements, "screen_width": 1080, "screen_height": 2400}
    try:
        store.start_task("deep", 1, "read the page", "emulator-5554")
        store.append_step(
            TimelineRecord(
                "deep", 1, 1, tool_name="tap", arguments={"element_id": "e299"}, screen=screen
            )
        )
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            page = c.get("/tasks/deep")
        assert page.status_code == 200, page.text[:300]
        tree = page.text.split('<ul class="tree">', 1)[1].split("<h4>Full JSON</h4>", 1)[0]
        assert all(f"box {i}" in tree for i in range(300))
    finally:
        store.close()


def test_now_without_a_lease_client_says_so(client: TestClient) -> None:
    page = client.get("/now")
    assert page.status_code == 200
    assert "no cloud connection configured" in page.text
    assert 'data-poll="/now/phones"' in page.text
    fragment = client.get("/now/phones")
    assert fragment.status_code == 200
    assert fragment.headers["cache-control"] == "no-store"


@dataclass
class _WithPhones:
    """A host's store and its phones as the registry lists them (no lease client)."""

    store: TimelineStore
    phones: list[DeviceInfo]
    lease: None = None

    @property
    def registry(self) -> _WithPhones:
        return self

    def devices(self) -> list[DeviceInfo]:
        return self.phones


def test_no_phones_yet_says_how_to_get_one(tmp_path: Path) -> None:
    """A host with no phone said only that it had seen none: the page now says what to do
    next (plug one in, or start an emulator, until adb lists it)."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        app = create_app(_WithPhones(store, []))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/now/phones").text
    finally:
        store.close()
    assert (
        '<p class="note" data-field="no-phones">No phones yet: the host has not seen any phone '
        "on its adb server. Plug one in with USB debugging on, or start an emulator: once "
        "<code>adb devices</code> lists it, it shows here.</p>"
    ) in html


def test_an_unhealthy_phone_shows_as_such_with_what_failed(tmp_path: Path) -> None:
    """A phone the host keeps out of work (`host.devices.health`) showed as "online" and idle
    on the host's page of its phones: nothing said why no task came to it. It shows as
    unhealthy, with what failed and how it clears."""
    why = "phone p1 is unhealthy: its screen could not be read in 3 attempts in a row"
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        phones = [
            DeviceInfo("p1", "Pixel", types_pb2.DEVICE_STATE_ONLINE, unhealthy=why),
            DeviceInfo("p2", "Pixel", types_pb2.DEVICE_STATE_ONLINE),
        ]
        app = create_app(_WithPhones(store, phones))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/now/phones").text
    finally:
        store.close()
    p1 = html[html.index('data-serial="p1"') : html.index('data-serial="p2"')]
    assert '<span class="pill device-unhealthy">unhealthy</span>' in p1
    assert f'<div class="small" data-field="unhealthy">{why}</div>' in p1
    assert (
        '<span class="pill device-online">online</span>' in html[html.index('data-serial="p2"') :]
    )


def test_a_phone_whose_id_the_cloud_refuses_shows_as_refused_saying_why(tmp_path: Path) -> None:
    """A phone with an id over the cloud's 128 characters is left out of the hello (commit
    20ba0b5), but the host's page of its phones showed it "online" and idle, as if work could
    come to it. It shows as refused, with why."""
    long = "X" * 129
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        phones = [
            DeviceInfo(long, long, types_pb2.DEVICE_STATE_ONLINE),
            DeviceInfo("p2", "Pixel", types_pb2.DEVICE_STATE_ONLINE),
        ]
        app = create_app(_WithPhones(store, phones))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/now/phones").text
    finally:
        store.close()
    row = html[html.index(f'data-serial="{long}"') : html.index('data-serial="p2"')]
    assert '<span class="pill device-refused">refused</span>' in row
    assert (
        '<div class="small" data-field="refused">left out of what the cloud hears: the cloud '
        "takes phone ids of at most 128 characters, this one has 129; it gets no work</div>"
    ) in row
    assert (
        '<span class="pill device-online">online</span>' in html[html.index('data-serial="p2"') :]
    )


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "10.0.0.1", "[::2]:80"])
def test_foreign_host_headers_are_refused(filled: Filled, host: str) -> None:
    """A page that re-points its domain at 127.0.0.1 (DNS rebinding) gets nothing."""
    with TestClient(create_app(filled.state), base_url=BASE) as c:
        response = c.get("/login", headers={"host": host})
        assert response.status_code == 400


@pytest.mark.parametrize("host", ["127.0.0.1:8765", "localhost", "LOCALHOST:1", "[::1]:8765"])
def test_loopback_host_headers_are_served(filled: Filled, host: str) -> None:
    with TestClient(create_app(filled.state), base_url=BASE) as c:
        assert c.get("/login", headers={"host": host}).status_code == 200


def test_remote_console_with_named_hosts_answers_to_those(filled: Filled) -> None:
    settings = HostConsoleSettings(
        bind_host="0.0.0.0", allow_remote=True, allowed_hosts=["phones.lab.example"]
    )
    with TestClient(create_app(filled.state, settings), base_url=BASE) as c:
        assert c.get("/login", headers={"host": "phones.lab.example:8765"}).status_code == 200
        assert c.get("/login", headers={"host": "other.example"}).status_code == 400


def test_the_refusal_names_the_setting_that_lists_host_names(filled: Filled) -> None:
    with TestClient(create_app(filled.state), base_url=BASE) as c:
        refused = c.get("/login", headers={"host": "evil.example"})
    assert refused.status_code == 400
    assert "AMC_HOST_CONSOLE_ALLOWED_HOSTS" in refused.text, refused.text


def test_allowed_hosts_are_read_comma_separated_as_the_cloud_console_s(
    filled: Filled, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One form for both consoles' setting; a JSON list (pydantic's default) still reads."""
    monkeypatch.setenv("AMC_HOST_CONSOLE_ALLOWED_HOSTS", "phones.lab.example, pi.local")
    assert HostConsoleSettings().allowed_hosts == ["phones.lab.example", "pi.local"]
    monkeypatch.setenv("AMC_HOST_CONSOLE_ALLOWED_HOSTS", '["phones.lab.example"]')
    assert HostConsoleSettings().allowed_hosts == ["phones.lab.example"]
    monkeypatch.setenv("AMC_HOST_CONSOLE_ALLOWED_HOSTS", "*")
    with TestClient(create_app(filled.state, HostConsoleSettings()), base_url=BASE) as c:
        assert c.get("/login", headers={"host": "anything.example"}).status_code == 200


def test_live_timeline_returns_steps_after_those_shown(client: TestClient, filled: Filled) -> None:
    total = len(filled.store.steps(T_DARK, 1))
    live = client.get(f"/tasks/{T_DARK}/live", params={"attempt": 1, "after": total - 2}).json()
    assert live["status"] == "succeeded"
    assert live["count"] == total
    assert live["html"].count('class="step card"') == 2
    assert f'id="step-{total}"' in live["html"]
    nothing = client.get(f"/tasks/{T_DARK}/live", params={"attempt": 1, "after": total}).json()
    assert nothing["html"] == ""


@pytest.mark.parametrize(
    ("live", "query"),
    [
        ("/live", {"attempt": 2**63}),
        ("/live", {"attempt": 1, "after": 2**63}),
        ("/live", {"attempt": 2**31}),
        ("", {"attempt": 2**63}),
    ],
)
def test_numbers_too_large_are_refused_not_a_500(
    client: TestClient, live: str, query: dict[str, int]
) -> None:
    """Past SQLite's 64 bits the store's query raised: an attempt or step beyond int32 is 422."""
    response = client.get(f"/tasks/{T_DARK}{live}", params=query)
    assert response.status_code == 422


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/tasks", {"page": "1_0"}),
        ("/tasks", {"page": "+2"}),
        (f"/tasks/{T_DARK}", {"attempt": "1.0"}),
        (f"/tasks/{T_DARK}/live", {"attempt": "1", "after": "1_0"}),
    ],
)
def test_whole_numbers_are_written_in_digits_only(
    client: TestClient, path: str, query: dict[str, str]
) -> None:
    """ "1_0" was read as 10, "+2" as 2, "1.0" as 1 (pydantic's lax mode): a number nobody
    wrote. Whole numbers are digits only: 422 naming the parameter."""
    response = client.get(path, params=query)
    assert response.status_code == 422, response.text
    assert next(iter(k for k, v in query.items() if not v.isdigit())) in response.text


def test_live_timeline_without_session_is_401(anon: TestClient) -> None:
    assert anon.get(f"/tasks/{T_DARK}/live", params={"attempt": 1}).status_code == 401


def test_task_list_pages(filled: Filled) -> None:
    app = create_app(filled.state, HostConsoleSettings(page_size=2))
    with TestClient(app, base_url=BASE, follow_redirects=False) as c:
        log_in(c, app.state.login_token.current)
        first = c.get("/tasks").text
        second = c.get("/tasks", params={"page": 2}).text
    assert first.count("data-task-id=") == 2
    assert "/tasks?page=2" in first
    assert second.count("data-task-id=") == 1
    assert "/tasks?page=1" in second


_PATH_CHARS = st.characters(codec="utf-8", exclude_categories=["Cs"])


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.one_of(
        st.text(_PATH_CHARS, max_size=300),
        st.lists(
            st.sampled_from(["..", ".", "%00", "%2e", "%2f", "%5c", "\x00", "/", "x.png", "é"]),
            max_size=30,
        ).map("".join),
    )
)
def test_artifact_route_never_fails_on_any_path(client: TestClient, path: str) -> None:
    """Whatever follows /artifacts/ — control characters, NULs raw or percent-encoded, huge or
    deep names — the answer is a 404, a 200 for a real screenshot, or a redirect (to /login,
    or a path the client normalised to a folder); never a 500."""
    response = client.get("/artifacts/" + quote(path, safe="/%"))
    assert response.status_code in (200, 303, 307, 404), (path, response.status_code)


def test_a_screenshot_is_kept_by_no_cache_and_refused_after_logout(client: TestClient) -> None:
    """Screenshots were served `private, max-age=3600`: after logging out, the browser showed
    them again from its cache for an hour to whoever used it next, no login asked."""
    path = f"/artifacts/{T_DARK}-a1/step001-before.png"
    shown = client.get(path)
    assert shown.status_code == 200 and shown.headers["content-type"] == "image/png"
    assert shown.headers["cache-control"] == "no-store"
    logout = client.post("/logout", data={"csrf_token": csrf_of(client.get("/now").text)})
    assert logout.status_code == 303
    again = client.get(path)
    assert again.status_code == 303 and again.headers["location"].startswith("/login")
    assert again.headers["cache-control"] == "no-store"


def test_a_replayed_cookie_after_logout_is_refused(anon: TestClient) -> None:
    tokens = cast(FastAPI, anon.app).state.login_token  # create_app's app
    assert log_in(anon, tokens.current).status_code == 303
    cookie = next(iter(anon.cookies.jar))
    copied = (cookie.name, cookie.value or "")
    logout = anon.post("/logout", data={"csrf_token": csrf_of(anon.get("/now").text)})
    assert logout.status_code == 303
    anon.cookies.clear()
    anon.cookies.set(*copied)
    assert anon.get("/now").status_code == 303  # to /login: the session ended on the server
    assert anon.get("/now/phones").status_code == 401


def test_token_guessing_is_throttled(anon: TestClient) -> None:
    tokens = cast(FastAPI, anon.app).state.login_token  # create_app's app
    for _ in range(5):
        assert log_in(anon, "guess").status_code == 401
    right = tokens.current
    refused = log_in(anon, right)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert "Too many failed attempts" in refused.text
    assert tokens.current == right  # the real token was not even tried (so not used up)


def test_each_step_shows_the_tree_the_model_was_shown_and_readable_timings(
    client: TestClient, filled: Filled
) -> None:
    """The issue: "the UI tree section did not appear" (only a `get_ui_tree` step had one) and
    "timings show raw keys (before_ocr_s 1.31 s)"."""
    html = client.get(f"/tasks/{T_DARK}").text
    records = filled.store.steps(T_DARK, 1)
    assert all(r.screen.get("elements") for r in records)
    tap = html[html.index('id="step-3"') : html.index('id="step-4"')]
    assert "UI tree the model was shown" in tap
    assert '<details class="ui-tree">' in tap  # closed: the model did not ask for it
    asked = html[html.index('id="step-2"') : html.index('id="step-3"')]
    assert '<details class="ui-tree" open>' in asked and "UI tree the model asked for" in asked
    assert "Looking at the screen (before)" in tap
    assert "Planning (until the decision arrived)" in tap
    assert "Acting on the phone" in tap
    assert "· text recognition (OCR)" in tap
    for raw in ("before_ocr_s", "perceive_before_s", "plan_s", "act_s"):
        assert raw not in tap


def test_the_tap_is_drawn_on_the_before_screenshot(client: TestClient, filled: Filled) -> None:
    html = client.get(f"/tasks/{T_DARK}").text
    tap = filled.store.steps(T_DARK, 1)[2]
    x, y = tap.result["point"]
    section = html[html.index('id="step-3"') : html.index('id="step-4"')]
    svg = section[section.index("<svg") : section.index("</svg>")]
    assert 'viewBox="0 0 1080 2400"' in svg  # the screenshot's own pixels
    assert f'<circle cx="{x}" cy="{y}"' in svg
    assert 'data-marker="tap"' in svg
    assert f"tap ({x}, {y})" in section
    launch = html[html.index('id="step-1"') : html.index('id="step-2"')]
    assert "<svg" not in launch  # launching an app touches no point


def test_a_swipe_is_drawn_as_a_line() -> None:
    from host.console import present

    record = TimelineRecord(
        "t",
        1,
        1,
        action={"swipe": {"start": {"x": 500, "y": 1800}, "end": {"x": 500, "y": 400}}},
    )
    assert present.marker(record) == present.Marker("swipe", 500, 1800, 500, 400)
    old = TimelineRecord("t", 1, 2, action={"tap": {"point": {"x": 3, "y": 4}}})
    assert present.marker(old) == present.Marker("tap", 3, 4)
    assert present.marker(TimelineRecord("t", 1, 3, action={"press_key": {"key": 1}})) is None
    assert present.png_size(Path("/nonexistent.png")) is None


def test_a_token_from_amc_host_token_logs_in_once(filled: Filled, tmp_path: Path) -> None:
    """`amc host token` runs in another process: it leaves the token's hash in the console's
    token folder; the console takes it once, and prints the token for the next login."""
    from host.console.login_token import OneTimeToken, issue

    folder = tmp_path / "console-tokens"
    told: list[str] = []
    tokens = OneTimeToken(issued_dir=folder, on_rotate=told.append)
    issued = issue(folder)
    assert folder.stat().st_mode & 0o077 == 0
    assert issued not in "".join(p.name for p in folder.iterdir())  # only its hash is on disk
    app = create_app(filled.state, login_token=tokens)
    with TestClient(app, base_url=BASE, follow_redirects=False) as browser:
        assert log_in(browser, issued).status_code == 303
        assert told == [tokens.current]  # the next login's token, printed after this one
    with TestClient(app, base_url=BASE, follow_redirects=False) as other:
        assert log_in(other, issued).status_code == 401
        assert log_in(other, tokens.current).status_code == 303
    assert len(told) == 2 and told[1] == tokens.current


def test_an_issued_token_expires(tmp_path: Path) -> None:
    import os
    import time

    from host.console.login_token import ISSUED_TTL_S, OneTimeToken, issue

    folder = tmp_path / "console-tokens"
    stale = issue(folder)
    (path,) = folder.iterdir()
    past = time.time() - ISSUED_TTL_S - 1
    os.utime(path, (past, past))
    assert not OneTimeToken(issued_dir=folder).redeem(stale)
    assert not path.exists()


def test_the_task_page_links_its_export_and_it_downloads(client: TestClient) -> None:
    """The "Download" link: this host's export of the task, screenshots included, and the
    secret the task typed in none of its files."""
    page = client.get(f"/tasks/{T_SECRET}")
    link = re.search(r'<a class="button" href="([^"]+)" download data-field="export"', page.text)
    assert link is not None
    response = client.get(link.group(1))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/zip"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="amc-export-{T_SECRET}.zip"'
    )
    run = read_bundle(response.content)
    assert run.task_id == T_SECRET
    assert run.origin == "host"
    assert len(run.steps) == 4
    assert all(s.before_png for s in run.steps)
    with zipfile.ZipFile(io.BytesIO(response.content)) as z:
        for name in z.namelist():
            assert SECRET.encode() not in z.read(name), name
    assert client.get("/tasks/no-such-task/export").status_code == 404


def test_an_attempt_s_tokens_count_cache_reads_and_writes_as_the_cloud_s_totals_do(
    tmp_path: Path,
) -> None:
    """The host console counts an attempt's tokens, and its failed decisions' calls', as every
    billed token (cache reads and writes too): what the cloud's totals, the cloud console and
    the token budgets count, so the two consoles agree on one attempt."""
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("t-cache", 1, "Open two apps", "virtual-1", planner_transport="direct")
        usage = {
            "input_tokens": 500,
            "output_tokens": 100,
            "cache_read_input_tokens": 300,
            "cache_creation_input_tokens": 2000,
            "cost_usd": 0.003,
        }
        store.append_step(TimelineRecord("t-cache", 1, 1, tool_name="launch_app", usage=usage))
        billed = Billed("anthropic", "claude-sonnet-4-6", Usage(2000, 400, 100, 50, 0, 0.012))
        store.add_failed_calls("t-cache", 1, billed, "PlannerError")
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            page = c.get("/tasks/t-cache").text
    finally:
        store.close()
    assert '<dd data-field="cost">5,450 tokens · $0.0150</dd>' in page
    shown = re.search(r'data-field="failed-calls"[^>]*>([^<]*)<', page)
    assert shown is not None, page
    assert shown.group(1) == "1 failed decision&#39;s billed model calls: 2,550 tokens · $0.0120"


def test_no_export_without_a_session(anon: TestClient) -> None:
    response = anon.get(f"/tasks/{T_DARK}/export")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/login")


def test_an_attempt_s_cost_counts_its_failed_decisions_calls(tmp_path: Path) -> None:
    """A direct-transport attempt whose second decision failed after billed calls: the task
    page's cost is the step's plus the failed decision's (what the cloud's totals say), and a
    line says what the failed one cost; the host's export lists it too."""
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("t-failed", 1, "Open two apps", "virtual-1", planner_transport="direct")
        usage = {"input_tokens": 500, "output_tokens": 100, "cost_usd": 0.003}
        store.append_step(TimelineRecord("t-failed", 1, 1, tool_name="launch_app", usage=usage))
        billed = Billed("anthropic", "claude-sonnet-4-6", Usage(2000, 400, cost_usd=0.012))
        store.add_failed_calls("t-failed", 1, billed, "PlannerError")
        store.finish_task("t-failed", 1, "failed", "gave an unusable tool call twice")
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            page = c.get("/tasks/t-failed").text
            exported = read_bundle(c.get("/tasks/t-failed/export").content)
    finally:
        store.close()
    assert '<dd data-field="cost">3,000 tokens · $0.0150</dd>' in page
    shown = re.search(r'data-field="failed-calls"[^>]*>([^<]*)<', page)
    assert shown is not None, page
    assert shown.group(1) == "1 failed decision&#39;s billed model calls: 2,400 tokens · $0.0120"
    assert [(f.attempt, f.decisions, f.usage.input_tokens) for f in exported.failed_calls] == [
        (1, 1, 2000)
    ]


def test_now_says_which_phones_share_an_adb_serial(filled: Filled) -> None:
    """Phones with one serial get ids of their own (`serial@t<transport id>`): the page says
    why the id is not the serial and that adb tells them apart by transport id only."""
    from dataclasses import dataclass

    from host.devices.registry import DeviceRegistry
    from host.devices.virtual.adb_server import ThreadedAdbServer
    from host.devices.virtual.phone import VirtualPhone

    @dataclass
    class WithPhones:
        store: TimelineStore
        registry: DeviceRegistry
        lease: None = None

    serial = "0123456789ABCDEF"
    with ThreadedAdbServer([VirtualPhone(serial), VirtualPhone(serial)]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
    app = create_app(WithPhones(filled.store, registry))
    with TestClient(app, base_url=BASE, follow_redirects=False) as c:
        log_in(c, cast(FastAPI, c.app).state.login_token.current)
        html = c.get("/now/phones").text
    rows = re.findall(r'<tr data-serial="([^"]+)".*?</tr>', html, re.S)
    assert sorted(rows) == [f"{serial}@t1", f"{serial}@t2"]
    notes = re.findall(r'data-field="adb-serial">(.*?)</div>', html, re.S)
    assert len(notes) == 2
    assert all(serial in n and "shared with another phone" in n for n in notes)


def test_an_ended_task_s_last_step_reads_as_on_the_cloud_console(client: TestClient) -> None:
    """The host console said a step's progress in its own words: the step's raw status beside
    the task's ("failed · step 6 · succeeded · give up"), where the cloud console and `amc task
    show` say "last step 6 · action done · give up" of the same step. Both now use the same
    words (`webui.steps.step_line`)."""
    for path in ("/tasks", f"/tasks/{T_DARK}"):
        html = client.get(path).text
        row = html[html.index(f"{T_DARK}") :] if path == "/tasks" else html
        shown = re.search(r'class="badge"(?: data-field="progress")?>([^<]*)<', row)
        assert shown is not None, path
        assert shown.group(1) == "last step 5 · action done · done: dark theme is on", path


def test_a_task_id_prefix_leads_to_the_task_and_an_ambiguous_one_says_which(
    tmp_path: Path,
) -> None:
    """The cloud console and `amc task …` take a unique prefix of a task id (as a terminal or
    a log line shows it); the host console answered one with "no task …" although it held
    the task. It leads to the task now (keeping the attempt asked for), and a prefix several
    held tasks share, or none, is a 404 saying which (the cloud console's rules, one place)."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    dark, light, other = "abc1" + "0" * 28, "abc2" + "0" * 28, "f00d" + "1" * 28
    for task_id in (dark, light, other):
        store.start_task(task_id, 1, f"goal of {task_id}", "emulator-5554")
    store.start_task(other, 2, f"goal of {other}", "emulator-5554")
    try:
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            assert log_in(c, app.state.login_token.current).status_code == 303
            for typed in ("f00", "F00D1"):
                short = c.get(f"/tasks/{typed}", params={"attempt": "1"})
                assert short.status_code == 307, short.text
                assert short.headers["location"] == f"/tasks/{other}?attempt=1"
            page = c.get(f"/tasks/{other}?attempt=1")
            assert page.status_code == 200 and f"goal of {other}" in page.text
            assert c.get("/tasks/abc1").headers["location"] == f"/tasks/{dark}"
            # The whole id in capitals (as some tools write hexadecimal) is the task too.
            assert c.get(f"/tasks/{dark.upper()}").headers["location"] == f"/tasks/{dark}"

            several = c.get("/tasks/abc")
            assert several.status_code == 404
            assert f"task id prefix abc is ambiguous on this host: {dark}, {light}" in several.text
            assert "give more characters of the id" in several.text
            none = c.get("/tasks/0bad")
            assert none.status_code == 404
            assert "no task id starts with 0bad on this host" in none.text
            whole = c.get(f"/tasks/{'e' * 32}")
            assert whole.status_code == 404 and "no task &#39;eeee" in whole.text
    finally:
        store.close()


def test_a_step_s_token_counts_are_written_with_thousands_separators(tmp_path: Path) -> None:
    """The step's usage table writes its counts as the cloud console does ("1,500"), and a
    count the record lacks as "—". Before, it printed "1500" and "2500000" bare."""
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("t-usage", 1, "Open two apps", "virtual-1", planner_transport="direct")
        usage = {
            "input_tokens": 1500,
            "output_tokens": 2_500_000,
            "cache_read_input_tokens": 999,
            "cost_usd": 0.003,
        }
        store.append_step(TimelineRecord("t-usage", 1, 1, tool_name="launch_app", usage=usage))
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            page = c.get("/tasks/t-usage").text
    finally:
        store.close()
    table = re.search(r'<table class="usage small">(.*?)</table>', page, re.S)
    assert table is not None, page
    cells = dict(re.findall(r"<th>([^<]*)</th><td>([^<]*)</td>", table.group(1)))
    assert cells["Input tokens"] == "1,500"
    assert cells["Output tokens"] == "2,500,000"
    assert cells["Cache read"] == "999"
    assert cells["Thinking tokens"] == "—"


def test_a_step_where_a_replay_set_its_flow_aside_says_so(tmp_path: Path) -> None:
    """The replay stopped at a switch already on (no divergence, nothing counted): the
    decision carried no flow, and the timeline said nothing of the flow being set aside. It says
    "flow F set aside at step N: why", and that the model decided the step."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    why = "'Dark theme' LinearLayout is already on, so tapping it would undo what the flow does"
    try:
        store.start_task("sa", 1, "Turn on dark theme", "emulator-5554")
        store.append_step(
            TimelineRecord(
                "sa",
                1,
                1,
                tool_name="tap",
                planner_mode="replay",
                flow={"flow_id": "f1", "flow_step": 2, "divergence": ""},
            )
        )
        store.append_step(
            TimelineRecord(
                "sa",
                1,
                2,
                tool_name="complete",
                planner_mode="compact",
                flow={"flow_id": "f1", "flow_step": 3, "divergence": "", "set_aside": why},
            )
        )
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/tasks/sa").text
    finally:
        store.close()
    _, aside = html.split('<section class="step card"')[1:3]
    assert f"flow f1 set aside at step 3: {html_escape(why)}" in aside
    assert "took over" not in aside and "no model call" not in aside
    assert "thinking-kind" in aside  # the model decided it


def test_a_replayed_step_says_no_model_was_called_and_shows_no_thinking(tmp_path: Path) -> None:
    """A replayed step on the timeline had a "no thinking" pill, a Thinking section saying
    "The model wrote no thinking for this step", a Prompts section and a "Model's answer": all
    of it said a model was called. It says it was replayed with no model call; the step the
    model decided keeps them."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("rp", 1, "Turn on dark theme", "emulator-5554")
        store.append_step(
            TimelineRecord(
                "rp",
                1,
                1,
                tool_name="tap",
                planner_mode="replay",
                flow={"flow_id": "f1", "flow_step": 1, "divergence": ""},
            )
        )
        store.append_step(TimelineRecord("rp", 1, 2, tool_name="tap", planner_mode="compact"))
        app = create_app(StoreOnly(store))
        with TestClient(app, base_url=BASE, follow_redirects=False) as c:
            log_in(c, app.state.login_token.current)
            html = c.get("/tasks/rp").text
    finally:
        store.close()
    replayed, modelled = html.split('<section class="step card"')[1:3]
    assert "replayed · flow f1 step 1 · no model call" in replayed
    assert "no model was called, so this step has no thinking" in replayed
    for said in ("The model wrote no thinking", "Prompts", "Model's answer", "thinking-kind"):
        assert said not in replayed, said
        assert said in modelled, said
