"""The console's JSON API against a real cloud: auth, tasks, decisions, hosts, errors, SSE."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import queue
import select
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from cryptography import x509
from PIL import Image
from starlette.responses import StreamingResponse

from amc.v1 import artifact_service_pb2, lease_service_pb2, types_pb2
from amc.v1.artifact_service_pb2_grpc import ArtifactServiceStub
from cloud import pki as cloud_pki
from cloud.cert_validity import when
from cloud.server import build_server
from cloud.settings import CloudSettings
from cloud.store import states
from cloud.store.database import Store
from cloud.store.models import TaskRow
from console.gateway import api as gateway_api
from console.gateway import create_app
from console.gateway.errors import UNREACHABLE
from console.gateway.history import DIRECT_TRANSPORT, NOT_ASSIGNED_YET
from console.settings import ConsoleSettings
from planner.secret_refs import MAX_SECRETS, MAX_VALUE
from tests.console.console_stack import (
    ADMIN,
    API_TOKEN,
    PASSWORD,
    Cloud,
    HostFactory,
    Operator,
    SimHost,
    UvicornThread,
    fail_after_first_change,
)
from tests.support.bad_certs import flawed_copy
from tests.support.loop_thread import LoopThread
from tests.support.tcp_proxy import TcpProxy
from webui.errors import UNEXPECTED
from webui.limits import MAX_BODY_BYTES, TOO_LARGE


def unique(goal: str) -> str:
    return f"{goal} {uuid.uuid4().hex[:8]}"


def sse_events(response: httpx.Response) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of a text/event-stream response, as they arrive."""
    event, data = "message", list[str]()
    for line in response.iter_lines():
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def test_api_without_credentials_is_401(anon: httpx.Client) -> None:
    response = anon.get("/api/tasks")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    wrong = anon.get("/api/tasks", headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401


def test_submit_list_get_and_cancel(api: httpx.Client) -> None:
    goal = unique("Turn on dark theme")
    created = api.post("/api/tasks", json={"goal": goal, "host_id": "nowhere", "max_attempts": 2})
    assert created.status_code == 201, created.text
    task = created.json()["task"]
    assert task["status"] == "queued"
    assert task["max_attempts"] == 2
    assert task["target"]["host_id"] == "nowhere"
    assert created.json()["warnings"] == [
        "host nowhere has never connected to this cloud: the task waits until it does, or "
        "until its deadline passes"
    ]
    assert task["totals"]["steps"] == 0 and task["totals"]["decisions"] == 0
    assert task["lease_expires_at"] is None and task["cancelled_by"] == ""

    listed = api.get("/api/tasks", params={"q": goal.split()[-1], "status": "queued"})
    assert [t["task_id"] for t in listed.json()["tasks"]] == [task["task_id"]]
    none = api.get("/api/tasks", params={"q": goal.split()[-1], "status": "running"})
    assert none.json()["tasks"] == []

    detail = api.get(f"/api/tasks/{task['task_id']}").json()
    assert detail["task"]["goal"] == goal
    assert detail["history"] == []
    assert detail["history_note"] == NOT_ASSIGNED_YET

    cancelled = api.post(f"/api/tasks/{task['task_id']}/cancel", json={"reason": "not needed"})
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["cancelled_by"] == "API token via console"
    history = api.get(f"/api/tasks/{task['task_id']}/lease-events").json()["events"]
    assert [(e["kind"], e["attempt"], e["operator"], e["reason"]) for e in history] == [
        ("cancelled", 0, "API token via console", "not needed")
    ]
    assert api.get(f"/api/tasks/{task['task_id']}").json()["events"] == history

    again = api.post(f"/api/tasks/{task['task_id']}/cancel", json={"reason": "twice"})
    assert again.status_code == 409
    assert again.json()["grpc_code"] == "FAILED_PRECONDITION"
    # The state as operators read it, not the enum's name (it said "(TASK_STATUS_CANCELLED)").
    assert again.json()["detail"] == f"task {task['task_id']} already ended: cancelled"


def test_validate_only_checks_without_queueing(api: httpx.Client) -> None:
    goal = unique("Only checked")
    checked = api.post(
        "/api/tasks", json={"goal": goal, "host_id": "nowhere", "validate_only": True}
    )
    assert checked.status_code == 201, checked.text
    assert checked.json()["task"] is None
    assert checked.json()["warnings"][0].startswith("host nowhere has never connected")
    assert api.get("/api/tasks", params={"q": goal}).json()["tasks"] == []
    malformed = api.post("/api/tasks", json={"goal": goal, "device_serial": "has space"})
    assert malformed.status_code == 422
    assert malformed.json()["detail"].startswith("target.device_serial: 'has space'")
    assert api.get("/api/tasks/no-such-task/lease-events").status_code == 404


def test_paging_follows_the_cloud_tokens(api: httpx.Client) -> None:
    tag = uuid.uuid4().hex[:8]
    ids = [
        api.post("/api/tasks", json={"goal": f"page {tag} {i}", "host_id": "nowhere"}).json()[
            "task"
        ]["task_id"]
        for i in range(3)
    ]
    first = api.get("/api/tasks", params={"q": tag, "page_size": 2}).json()
    assert len(first["tasks"]) == 2
    assert first["next_page_token"]
    second = api.get(
        "/api/tasks", params={"q": tag, "page_size": 2, "page_token": first["next_page_token"]}
    ).json()
    seen = [t["task_id"] for t in first["tasks"] + second["tasks"]]
    assert sorted(seen) == sorted(ids)
    assert seen == list(reversed(ids))  # newest first


def test_unknown_task_is_404_with_the_cloud_message(api: httpx.Client) -> None:
    response = api.get("/api/tasks/does-not-exist")
    assert response.status_code == 404
    assert response.json()["grpc_code"] == "NOT_FOUND"
    assert response.json()["detail"]


def test_invalid_submit_is_422_with_the_cloud_message(api: httpx.Client) -> None:
    response = api.post("/api/tasks", json={"goal": ""})
    assert response.status_code == 422
    body = response.json()
    assert body["grpc_code"] == "INVALID_ARGUMENT"
    assert body["detail"]


def test_hosts_show_connected_sim_host(api: httpx.Client, make_host: HostFactory) -> None:
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    hosts = {
        h["host_id"]: h for h in api.get("/api/hosts", params={"q": host.host_id}).json()["hosts"]
    }
    mine = hosts[host.host_id]
    assert mine["connected"] is True
    assert mine["planner_transport"] == "direct"
    assert mine["devices"] == [
        {"serial": "emu-1", "model": "amc virtual phone", "state": "online", "reason": ""}
    ]
    connected = api.get("/api/hosts", params={"connected_only": True, "q": host.host_id}).json()[
        "hosts"
    ]
    assert host.host_id in {h["host_id"] for h in connected}


def test_hosts_are_paged_like_the_other_listings(
    api: httpx.Client, make_host: HostFactory, cloud: Cloud
) -> None:
    """/api/hosts answered every host of the fleet at once. It pages as /api/tasks does
    (`page_size`, `page_token`, `next_page_token`), by id, and `q`
    keeps the hosts whose id holds that text."""
    tag = uuid.uuid4().hex[:8]
    hosts = []
    for i in range(3):
        host_id = f"pg-{tag}-{i}"
        cloud_pki.write_host_cert(cloud.pki, host_id)
        hosts.append(SimHost(cloud.address, cloud.pki, host_id))
        hosts[-1].connect()
    try:
        seen: list[str] = []
        token = ""
        pages = 0
        while True:
            params: dict[str, str | int] = {"q": tag.upper(), "page_size": 2, "page_token": token}
            body = api.get("/api/hosts", params=params).json()
            assert len(body["hosts"]) <= 2, body
            seen += [h["host_id"] for h in body["hosts"]]
            token = body["next_page_token"]
            pages += 1
            if not token:
                break
        assert seen == [h.host_id for h in hosts] and pages == 2
        assert "dispatch" in body
        refused = api.get("/api/hosts", params={"page_token": "garbage"})
        assert refused.status_code == 422
        assert refused.json()["detail"].startswith("page_token: not a page token")
    finally:
        for host in hosts:
            host.close()


def test_detail_has_progress_and_cloud_decisions(api: httpx.Client, make_host: HostFactory) -> None:
    host = make_host(types_pb2.PLANNER_TRANSPORT_CLOUD)
    goal = unique("Open Display settings")
    task = api.post("/api/tasks", json={"goal": goal, "host_id": host.host_id}).json()["task"]
    assignment = host.assignment()
    assert assignment.task_id == task["task_id"]

    empty = api.get(f"/api/tasks/{task['task_id']}").json()
    assert empty["history"][0]["empty_reason"] == "no step reported yet"

    host.renew(assignment, 1, types_pb2.STEP_STATUS_PLANNING, "planning")
    decision = host.decide(assignment, goal)
    host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")

    detail = api.get(f"/api/tasks/{task['task_id']}").json()
    assert detail["task"]["status"] == "running"
    assert detail["task"]["progress"]["step_index"] == 1
    assert detail["task"]["progress"]["summary"] == "tap 'Display'"
    [attempt] = detail["task"]["attempts"]
    assert attempt["planner_transport"] == "cloud"
    assert attempt["host_id"] == host.host_id
    [history] = detail["history"]
    assert history["empty_reason"] is None
    [step] = history["decisions"]
    assert step["decision_id"] == decision.decision_id
    assert step["step_index"] == 1
    assert step["provider"] == "offline"
    assert step["tool_name"] == decision.tool_name
    assert step["purpose"] == decision.purpose
    assert step["expected_outcome"] == decision.expected_outcome
    assert step["user_prompt"].startswith("Goal:")
    assert step["arguments"] == json.loads(decision.arguments_json)

    one = api.get(f"/api/decisions/{decision.decision_id}").json()
    assert one["rationale"] == decision.rationale
    page = api.get(f"/api/tasks/{task['task_id']}/decisions", params={"attempt": 1}).json()
    assert [d["decision_id"] for d in page["decisions"]] == [decision.decision_id]


def test_a_detail_past_its_decision_cap_says_where_the_rest_is(
    api: httpx.Client, make_host: HostFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /api/tasks/{id} reads at most `MAX_DECISIONS` of the log (5,000; 2 here): a task
    with more gave the first ones and no word of the rest, and no way to them from the
    detail. It now gives a token the paged listing continues from."""
    monkeypatch.setattr(gateway_api, "MAX_DECISIONS", 2)
    host = make_host(types_pb2.PLANNER_TRANSPORT_CLOUD)
    goal = unique("Open Display settings")
    task_id = api.post("/api/tasks", json={"goal": goal, "host_id": host.host_id}).json()["task"][
        "task_id"
    ]
    assignment = host.assignment()
    made = [host.decide(assignment, goal).decision_id for _ in range(3)]

    detail = api.get(f"/api/tasks/{task_id}").json()
    [history] = detail["history"]
    assert [d["decision_id"] for d in history["decisions"]] == made[:2]
    token = detail["decisions_next_page_token"]
    assert token
    rest = api.get(f"/api/tasks/{task_id}/decisions", params={"page_token": token}).json()
    assert [d["decision_id"] for d in rest["decisions"]] == made[2:]
    assert rest["next_page_token"] == ""
    # Within the cap the detail is the whole log, and says so.
    monkeypatch.setattr(gateway_api, "MAX_DECISIONS", 3)
    whole = api.get(f"/api/tasks/{task_id}").json()
    assert [d["decision_id"] for d in whole["history"][0]["decisions"]] == made
    assert whole["decisions_next_page_token"] == ""


def test_direct_transport_history_says_why_it_is_empty(
    api: httpx.Client, make_host: HostFactory
) -> None:
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    task = api.post(
        "/api/tasks", json={"goal": unique("Open the clock"), "host_id": host.host_id}
    ).json()["task"]
    assignment = host.assignment()
    host.renew(assignment, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Clock'")
    detail = api.get(f"/api/tasks/{task['task_id']}").json()
    assert detail["history"][0]["planner_transport"] == "direct"
    assert detail["history"][0]["empty_reason"] == DIRECT_TRANSPORT
    assert detail["history_note"] == DIRECT_TRANSPORT


def test_task_events_stream_progress_until_the_task_ends(
    gateway: str, api: httpx.Client, make_host: HostFactory
) -> None:
    host = make_host()
    task = api.post(
        "/api/tasks", json={"goal": unique("Turn on wifi"), "host_id": host.host_id}
    ).json()["task"]
    assignment = host.assignment()
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    url = f"{gateway}/api/tasks/{task['task_id']}/events"
    with httpx.stream("GET", url, headers=headers, timeout=20) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
        name, data = next(events)
        assert name == "task"
        assert json.loads(data)["task_id"] == task["task_id"]  # the snapshot

        host.renew(assignment, 3, types_pb2.STEP_STATUS_ACTING, "tap 'Wi-Fi'")
        for name, data in events:
            body = json.loads(data)
            if name == "task" and body["progress"]["step_index"] == 3:
                assert body["status"] == "running"
                assert body["progress"]["summary"] == "tap 'Wi-Fi'"
                break
        else:
            pytest.fail("the stream ended without the renewed progress")

        host.finish(assignment, types_pb2.TASK_STATUS_SUCCEEDED, "Wi-Fi is on")
        seen = [(name, json.loads(data)) for name, data in events]
        assert seen[-1] == ("end", {"task_id": task["task_id"]})
        assert seen[-2][1]["status"] == "succeeded"


def test_fleet_events_carry_every_task_change(
    gateway: str, api: httpx.Client, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.stream("GET", f"{gateway}/api/events", headers=headers, timeout=20) as response:
        events = sse_events(response)
        task = operator.submit(unique("Fleet-wide"), host_id=host.host_id)
        assignment = host.assignment()
        host.renew(assignment, 1, types_pb2.STEP_STATUS_PERCEIVING, "looking")
        for name, data in events:
            body = json.loads(data)
            if (
                name == "task"
                and body["task_id"] == task.task_id
                and body["progress"]["step_index"] == 1
            ):
                assert body["progress"]["step_status"] == "perceiving"
                break
        else:
            pytest.fail("the fleet stream ended without the task's progress")


def test_host_events_without_the_snapshot_begin_with_the_next_change(
    gateway: str, make_host: HostFactory
) -> None:
    """The fleet page lists its page of hosts itself: the stream it listens to leaves out
    every host of the fleet (and snapshot-complete) it would otherwise begin with."""
    before = make_host()  # a host the snapshot would have carried
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    url = f"{gateway}/api/hosts/events?snapshot=false"
    done = threading.Event()
    after: list[str] = []

    def connect_until_seen() -> None:
        """Connect hosts until the stream shows one (it may subscribe a moment after it
        opened, and a change before that is not in a stream without its snapshot)."""
        while not done.is_set():
            after.append(make_host().host_id)
            done.wait(0.2)

    connector = threading.Thread(target=connect_until_seen, daemon=True)
    with httpx.stream("GET", url, headers=headers, timeout=20) as r:
        assert r.status_code == 200
        connector.start()
        try:
            name, data = next(sse_events(r))
        finally:
            done.set()
            connector.join()
    assert name == "host"
    assert json.loads(data)["host_id"] in after and before.host_id not in after


def test_host_events_carry_hosts_connecting_and_leaving(
    gateway: str, make_host: HostFactory
) -> None:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.stream("GET", f"{gateway}/api/hosts/events", headers=headers, timeout=20) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
        names = [name for name, _ in itertools.takewhile(lambda e: e[0] == "host", events)]
        assert len(names) == len(api_hosts(gateway))  # the snapshot: every host once
        host = make_host()
        for name, data in events:
            body = json.loads(data)
            if name == "host" and body["host_id"] == host.host_id:
                assert body["connected"]
                assert [d["serial"] for d in body["devices"]] == ["emu-1"]
                break
        host.close()
        for name, data in events:
            body = json.loads(data)
            if name == "host" and body["host_id"] == host.host_id and not body["connected"]:
                break
        else:
            pytest.fail("the host stream ended without the host leaving")


def test_host_events_of_one_page_carry_only_that_page(gateway: str, cloud: Cloud) -> None:
    """Issue 21: every browser's stream carried every host's change (10,000 hosts) and the
    page kept its fifty. Scoped to a page of GET /api/hosts, the stream starts with that
    page, says where its range of ids ends (`scope`), and carries the changes of the hosts in
    that range only: one added to it, and one leaving the page's filter, once. A page token
    the cloud refuses ends the stream with a `cloud-error` INVALID_ARGUMENT."""
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    tag = uuid.uuid4().hex[:8]  # "0-…" sorts before every other host id of the session
    first, past, low = (cloud.host(f"0-{tag}-{name}") for name in ("a", "b", "0"))
    url = f"{gateway}/api/hosts/events?connection=connected&page_size=1"
    try:
        first.connect()
        past.connect()
        with httpx.stream("GET", url, headers=headers, timeout=20) as r:
            events = sse_events(r)
            name, data = next(events)
            assert (name, json.loads(data)["host_id"]) == ("host", first.host_id)
            assert next(events) == ("scope", json.dumps({"last_key": first.host_id}))
            assert next(events) == ("snapshot-complete", "{}")
            past.close()  # after the page's last host: not this page's
            low.connect()  # before it: added to the page
            heard: list[tuple[str, str, bool]] = []
            for connected in (True, False):
                for name, data in events:
                    body = json.loads(data)
                    heard.append((name, body["host_id"], body["connected"]))
                    if heard[-1] == ("host", low.host_id, connected):
                        break
                if connected:
                    low.close()
        # A leak of `past` would come right after `low` connecting (ids in order), before
        # its leaving.
        assert {(n, h) for n, h, _ in heard} <= {("host", first.host_id), ("host", low.host_id)}
        bad = f"{gateway}/api/hosts/events?connection=connected&page_size=1&page_token=nope"
        with httpx.stream("GET", bad, headers=headers, timeout=20) as r:
            name, data = next(sse_events(r))
        assert name == "cloud-error"
        assert json.loads(data)["grpc_code"] == "INVALID_ARGUMENT"
    finally:
        for host in (first, past, low):
            host.close()


def api_hosts(gateway: str) -> list[dict[str, object]]:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    hosts: list[dict[str, object]] = httpx.get(
        f"{gateway}/api/hosts?page_size=500", headers=headers, timeout=20
    ).json()["hosts"]
    return hosts


def login(client: httpx.Client) -> str:
    """Log in through the form; returns the session's CSRF token."""
    page = client.get("/login")
    token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
    done = client.post(
        "/login",
        data={"username": ADMIN, "password": PASSWORD, "csrf_token": token, "next": "/tasks"},
    )
    assert done.status_code == 303, done.text
    tasks = client.get("/tasks")
    return tasks.text.split('name="csrf_token" value="')[1].split('"')[0]


def test_session_writes_to_the_api_need_the_csrf_header(anon: httpx.Client) -> None:
    csrf = login(anon)
    assert anon.get("/api/tasks").status_code == 200
    body = {"goal": unique("csrf check"), "host_id": "nowhere"}
    refused = anon.post("/api/tasks", json=body)
    assert refused.status_code == 403
    accepted = anon.post("/api/tasks", json=body, headers={"X-CSRF-Token": csrf})
    assert accepted.status_code == 201, accepted.text


def test_cloud_unreachable_is_503(console_settings: ConsoleSettings) -> None:
    settings = console_settings.model_copy(update={"cloud_address": "127.0.0.1:1"})
    server = UvicornThread(create_app(settings))
    base = server.start()
    try:
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        response = httpx.get(f"{base}/api/hosts", headers=headers, timeout=20)
        assert response.status_code == 503
        # What is unavailable, without gRPC's "ipv4:127.0.0.1:1: Connection refused".
        assert response.json() == {"detail": UNREACHABLE, "grpc_code": "UNAVAILABLE"}
        assert httpx.get(f"{base}/healthz", timeout=20).json()["cloud"] == "UNAVAILABLE"
        # A readiness probe sends no traffic to a gateway whose every call would fail.
        ready = httpx.get(f"{base}/readyz", timeout=20)
        assert ready.status_code == 503 and ready.json()["cloud"] == "UNAVAILABLE"
        with httpx.stream("GET", f"{base}/api/events", headers=headers, timeout=20) as stream:
            name, data = next(sse_events(stream))
        assert (name, json.loads(data)["detail"]) == ("cloud-error", UNREACHABLE)
    finally:
        server.stop()


def test_an_operator_certificate_that_expired_while_the_console_ran_is_named(
    console_settings: ConsoleSettings, tmp_path: Path
) -> None:
    """The console started with an operator certificate valid for seconds; once it expired,
    the cloud refuses the gateway's handshake (gRPC says only "Socket closed"). A call and a
    live stream say whose certificate expired, which file and when, as `amc` does (exit 5),
    with a 502: waiting does not heal it. Before, both said "the cloud is not reachable"
    (503), and an operator looked for a cloud that was up."""
    assert console_settings.certs_dir is not None
    short = tmp_path / "pki"
    cert = flawed_copy(console_settings.certs_dir, "operator-console", "expires_in_seconds", short)
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    settings = ConsoleSettings(
        cloud_address=console_settings.cloud_address,
        certs_dir=short,
        operator_name="console",
        admin_password=PASSWORD,
        api_token=API_TOKEN,
        session_secret="test-session-secret-0123456789",
    )
    assert settings.client_cert == cert
    server = UvicornThread(create_app(settings))  # no call yet: no connection before expiry
    base = server.start()
    said = (
        f"this console's operator certificate {cert} expired {when(end)}: the cloud refuses "
        "it; issue a new one from the fleet CA with `amc certs operator DIR NAME` "
        "(AMC_CONSOLE_CERTS_DIR, AMC_CONSOLE_OPERATOR_NAME) and restart the console"
    )
    try:
        while datetime.now(UTC) <= end:  # a few seconds: the certificate's whole life
            time.sleep(0.1)
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        response = httpx.get(f"{base}/api/hosts", headers=headers, timeout=20)
        assert response.status_code == 502, response.text
        assert response.json() == {"detail": said, "grpc_code": "UNAVAILABLE"}
        with httpx.stream("GET", f"{base}/api/events", headers=headers, timeout=20) as stream:
            name, data = next(sse_events(stream))
        assert (name, json.loads(data)["detail"]) == ("cloud-error", said)
    finally:
        server.stop()


def test_the_gateway_retries_an_unreachable_cloud_every_few_seconds(
    console_settings: ConsoleSettings,
) -> None:
    """While the cloud is down (here: a port that takes connections and drops them) and people
    keep asking, the gateway tries to reconnect at least every `reconnect_max_s` (5 s by
    default, 0.2 s here). gRPC's default backoff grows to two minutes (over 8 s apart by the
    20th second), so a restarted cloud went on getting 503s from the gateway long after a fresh
    client reached it. With the default 5 s cap the attempts are over 2.6 s apart by the 10th
    second; with 0.2 s, a gap of 2 s is ten times the cap (room for a loaded machine)."""
    attempts: list[float] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    done = threading.Event()

    def drop_every_connection() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            attempts.append(time.monotonic())
            conn.close()

    dropper = threading.Thread(target=drop_every_connection, daemon=True)
    dropper.start()
    settings = console_settings.model_copy(
        update={
            "cloud_address": f"127.0.0.1:{port}",
            "reconnect_initial_s": 0.1,
            "reconnect_max_s": 0.2,
        }
    )
    server = UvicornThread(create_app(settings))
    base = server.start()
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end:
            httpx.get(f"{base}/healthz", timeout=20)
            time.sleep(0.2)
    finally:
        done.set()
        server.stop()
        dropper.join()
        listener.close()
    assert attempts, "the gateway never tried to connect"
    gaps = [b - a for a, b in itertools.pairwise([*attempts, end])]
    assert max(gaps) < 2, f"reconnect attempts {max(gaps):.1f} s apart"


def test_openapi_documents_the_models(anon: httpx.Client) -> None:
    schema = anon.get("/api/openapi.json").json()
    assert {"TaskOut", "TaskDetailOut", "DecisionOut", "HostOut", "ErrorOut"} <= set(
        schema["components"]["schemas"]
    )
    assert "/api/tasks/{task_id}/events" in schema["paths"]


def test_no_docs_page_loads_a_foreign_script(anon: httpx.Client) -> None:
    """FastAPI's /api/docs loaded Swagger UI from a CDN onto the console's origin, without
    login, CSP or integrity check; only the schema itself is served now."""
    docs = anon.get("/api/docs")
    assert docs.status_code == 404
    assert "cdn.jsdelivr.net" not in docs.text


@pytest.mark.parametrize("path", ["/tasks", "/fleet", "/tasks/new", "/tasks/x"])
def test_pages_without_session_redirect_to_login(anon: httpx.Client, path: str) -> None:
    response = anon.get(path)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/login?next=")


def test_events_of_an_unknown_task_are_404(api: httpx.Client) -> None:
    """Like every other route of an unknown task (it was a 200 stream of one cloud-error)."""
    response = api.get("/api/tasks/no-such-task/events")
    assert response.status_code == 404
    assert response.json()["grpc_code"] == "NOT_FOUND"


def test_openapi_declares_the_bearer_scheme(anon: httpx.Client) -> None:
    schema = anon.get("/api/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    # The API's routes take it; the health probes (no login) do not, though the app-wide
    # viewer check (`console.gateway.roles`) runs on them too.
    secured = {
        (method, path): bool(operation.get("security"))
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    }
    assert secured[("get", "/healthz")] is False and secured[("get", "/readyz")] is False
    assert all(v for (_, path), v in secured.items() if path.startswith("/api"))


def test_an_expired_lease_shows_as_the_next_attempt(
    api: httpx.Client, anon: httpx.Client, make_host: HostFactory
) -> None:
    """The host stops renewing; the cloud expires the lease (5 s, its minimum) and hands out
    attempt 2. The console shows "attempt 2 of 3" and attempt 1's last progress and reason."""
    host = make_host()
    goal = unique("Survive a lost lease")
    body = {"goal": goal, "host_id": host.host_id, "lease_duration_s": 5}
    task = api.post("/api/tasks", json=body).json()["task"]
    first = host.assignment()
    host.renew(first, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
    host.expect("revoked")  # the first lease ran out
    # Heard from again: a host silent since its lease ran out may be frozen (no new work).
    host.send(lease_service_pb2.LeaseRequest(outbox=types_pb2.OutboxBacklog()))
    second = host.assignment()
    assert second.attempt == 2

    detail = api.get(f"/api/tasks/{task['task_id']}").json()
    assert detail["task"]["attempt"] == 2
    old = next(a for a in detail["task"]["attempts"] if a["attempt"] == 1)
    assert old["status"] == "failed"
    assert old["failure_reason"]
    assert old["progress"]["step_index"] == 2
    assert [h["attempt"] for h in detail["history"]] == [2, 1]

    login(anon)
    html = anon.get(f"/tasks/{task['task_id']}").text
    assert "attempt 2 of 3" in html
    assert old["failure_reason"] in html
    assert "step 2 · acting · tap &#39;Display&#39;" in html


def test_health_and_streams_end_when_the_client_leaves(console_settings: ConsoleSettings) -> None:
    """Closing an event stream cancels its WatchProgress call (no watcher leaks per tab)."""
    server = UvicornThread(create_app(console_settings))
    base = server.start()
    try:
        health = httpx.get(f"{base}/healthz", timeout=20).json()
        assert health == {"status": "ok", "cloud": "SERVING", "open_streams": 0}
        assert httpx.get(f"{base}/readyz", timeout=20).status_code == 200
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        with httpx.stream("GET", f"{base}/api/events", headers=headers, timeout=20) as response:
            lines = response.iter_lines()  # keep it referenced: collecting it closes the stream
            assert next(lines) == "retry: 1000"
            assert httpx.get(f"{base}/healthz", timeout=20).json()["open_streams"] == 1
        deadline = time.monotonic() + 20
        while httpx.get(f"{base}/healthz", timeout=20).json()["open_streams"]:
            assert time.monotonic() < deadline, "the stream outlived its client"
            time.sleep(0.05)
    finally:
        server.stop()


def test_the_api_takes_secrets_and_says_the_warning(api: httpx.Client) -> None:
    plain = api.post("/api/tasks", json={"goal": "Sign in with PIN 2580", "host_id": "nowhere"})
    assert plain.status_code == 201, plain.text
    assert "credential" in plain.json()["warnings"][0]
    keyless = api.post(
        "/api/tasks",
        json={"goal": "Sign in with PIN {{secret:pin}}", "secrets": {"pin": "2580"}},
    )
    # This test cloud has no secrets key: refused, never stored in plain text.
    assert keyless.status_code == 409, keyless.text
    assert "AMC_CLOUD_SECRETS_KEY" in keyless.text and "2580" not in keyless.text


BIG = 2**31  # one past the largest int32 the cloud's messages carry


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("GET", f"/api/tasks/t/decisions?attempt={BIG}", None, "attempt"),
        ("GET", f"/api/tasks/t/attempts/{BIG}/conversation", None, "attempt"),
        ("GET", f"/api/tasks/t/attempts/1/steps/{BIG}/screens/before", None, "step"),
        ("POST", "/api/tasks", f'{{"goal": "g", "max_attempts": {BIG}}}', "max_attempts"),
        ("POST", "/api/tasks", '{"goal": "g", "max_attempts": "\u0663"}', "max_attempts"),
        ("GET", "/api/tasks?page_size=%EF%BC%93", None, "page_size"),
        ("POST", "/api/tasks", '{"goal": "g", "timeout_s": NaN}', "timeout_s"),
        ("POST", "/api/tasks", '{"goal": "g", "timeout_s": Infinity}', "timeout_s"),
        ("POST", "/api/tasks", '{"goal": "g", "lease_duration_s": 1e300}', "lease_duration_s"),
        ("POST", "/api/tasks", '{"goal": "g", "timeout_s": -1e300}', "timeout_s"),
        ("POST", "/api/tasks", '{"goal": "a\\ud800b", "host_id": "nowhere"}', "goal"),
        ("POST", "/api/tasks", '{"goal": "g", "secrets": {"pw": "\\udfff"}}', "secrets"),
        ("POST", "/api/tasks/t/cancel", '{"reason": "\\ud800"}', "reason"),
    ],
)
def test_out_of_range_input_is_a_422_naming_the_field(
    api: httpx.Client, method: str, path: str, body: str | None, field: str
) -> None:
    """Values the cloud's messages cannot carry are refused before they are encoded for it
    (they were plain-text 500s, and the connection dropped). Every error has ErrorOut's shape:
    `detail` one readable line, the problems themselves in `errors`, without their input."""
    headers = {"content-type": "application/json"}
    response = api.request(method, path, content=body, headers=headers)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert isinstance(error["detail"], str) and error["detail"].startswith(f"{field}")
    assert error["errors"][0]["loc"][1] == field
    assert "input" not in error["errors"][0]
    assert api.get("/api/tasks", params={"page_size": 1}).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("GET", "/api/tasks?page_size=1_0", None, "page_size"),
        ("GET", "/api/tasks?page_size=%2B3", None, "page_size"),
        ("GET", "/api/tasks?page_size=3.0", None, "page_size"),
        ("GET", "/api/tasks?page_size=%203", None, "page_size"),
        ("GET", "/api/flows?page_size=1_0", None, "page_size"),
        ("GET", "/api/tasks/t/decisions?attempt=1_0", None, "attempt"),
        ("GET", "/api/tasks/t/attempts/%2B1/conversation", None, "attempt"),
        ("GET", "/api/tasks/t/attempts/1/steps/1.0/screens/before", None, "step"),
        ("POST", "/api/tasks", '{"goal": "g", "max_attempts": "1_0"}', "max_attempts"),
        ("POST", "/api/tasks", '{"goal": "g", "max_attempts": "3"}', "max_attempts"),
        ("POST", "/api/tasks", '{"goal": "g", "max_attempts": 3.0}', "max_attempts"),
    ],
)
def test_whole_numbers_are_written_in_digits_only(
    api: httpx.Client, method: str, path: str, body: str | None, field: str
) -> None:
    """Whole numbers were read the way pydantic's lax mode reads them: "1_0" as 10, "+3" and
    " 3" as 3, "3.0" as 3 (a JSON 3.0 and a JSON string "3" too), so a typo reached the cloud
    as a number nobody wrote (ten attempts, a page of ten). Every whole-number parameter of the
    API (query, path, body) now takes digits only (a JSON body: an integer): 422 naming it."""
    headers = {"content-type": "application/json"}
    response = api.request(method, path, content=body, headers=headers)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["detail"].startswith(field), error
    assert error["errors"][0]["loc"][1] == field, error
    assert "input" not in error["errors"][0]
    assert api.get("/api/tasks", params={"page_size": "03"}).status_code == 200


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/api/tasks", "application/json"),
        ("/login", "application/x-www-form-urlencoded"),
        ("/tasks/new", "application/x-www-form-urlencoded"),
    ],
)
def test_a_body_past_the_limit_is_refused_before_it_is_read(
    anon: httpx.Client, path: str, content_type: str
) -> None:
    """A JSON body was read whole, whatever its size, before the bearer or session check: one
    anonymous 400 MiB POST to /api/tasks left the gateway holding ~0.9 GB, then a 422 (a form
    was stopped only by Starlette's 1 MiB per field, as a 400). Past MAX_BODY_BYTES any body
    is 413, by its Content-Length or, chunked, as it streams; answered as every other error
    is (the API's JSON, else the error page), not Starlette's plain text, which it was when
    the Content-Length said so."""
    headers = {"content-type": content_type}
    declared = anon.post(path, content=b"a" * (MAX_BODY_BYTES + 1), headers=headers)
    chunks = (b"a" * 65536 for _ in range(MAX_BODY_BYTES // 65536 + 1))
    chunked = anon.post(path, content=chunks, headers=headers)
    for refused in (declared, chunked):
        assert refused.status_code == 413, refused.text
        if path.startswith("/api"):
            assert refused.headers["content-type"] == "application/json"
            assert refused.json() == {"detail": TOO_LARGE}
        else:
            assert refused.headers["content-type"].startswith("text/html")
            assert "<h1>413" in refused.text and TOO_LARGE in refused.text
        assert refused.headers["cache-control"] == "no-store"


def test_the_largest_real_submission_fits_the_body_limit(api: httpx.Client) -> None:
    """Every secret the cloud takes, each at its longest and JSON-escaped at 12 bytes a
    character, still reaches the cloud, which answers for itself (no secrets key here)."""
    names = [f"s{i}" for i in range(MAX_SECRETS)]
    body = {
        "goal": " ".join(f"{{{{secret:{n}}}}}" for n in names),
        "secrets": {n: "\U0001f600" * MAX_VALUE for n in names},
    }
    content = json.dumps(body)  # ASCII: each emoji is "\ud83d\ude00"
    assert MAX_BODY_BYTES * 0.7 < len(content) < MAX_BODY_BYTES
    sent = api.post("/api/tasks", content=content, headers={"content-type": "application/json"})
    assert sent.status_code == 409, sent.text
    assert "AMC_CLOUD_SECRETS_KEY" in sent.text


def test_a_failure_of_the_gateway_itself_is_json_or_a_page(
    console_settings: ConsoleSettings,
) -> None:
    """An exception no handler takes is logged and answered in the API's ErrorOut shape (or
    the error page), with the security headers, instead of Starlette's plain text."""
    app = create_app(console_settings)

    @app.get("/api/boom")
    async def api_boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/boom")
    async def page_boom() -> None:
        raise RuntimeError("a bug")

    server = UvicornThread(app)
    base = server.start()
    try:
        with httpx.Client(base_url=base, timeout=20) as client:
            headers = {"Authorization": f"Bearer {API_TOKEN}"}
            answer = client.get("/api/boom", headers=headers)
            assert answer.status_code == 500
            assert answer.json() == {"detail": UNEXPECTED}
            assert answer.headers["x-content-type-options"] == "nosniff"
            page = client.get("/boom")
            assert page.status_code == 500
            assert page.headers["content-type"].startswith("text/html")
            assert "content-security-policy" in page.headers
            assert "the error is in its log" in page.text
    finally:
        server.stop()


def test_a_live_stream_that_fails_midway_says_so_and_ends_cleanly(
    console_settings: ConsoleSettings, operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure of the gateway's own code after a live stream began (`fail_after_first_change`)
    is a `stream-error` event in ErrorOut's shape,
    then the stream's proper end, and a log line naming the task. It cut the connection
    instead, without a word: the browser's EventSource reconnected every second, for ever."""
    app = create_app(console_settings)
    server = UvicornThread(app)
    base = server.start()
    # Pinned to a host that never connects: no other test's host may take it.
    task = operator.submit(f"stream then fail {uuid.uuid4().hex[:8]}", host_id="nowhere")
    fail_after_first_change(app)
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=20) as client:
            url = f"/api/tasks/{task.task_id}/events"
            with client.stream("GET", url) as stream:
                events = list(sse_events(stream))  # ends: no RemoteProtocolError
            assert [name for name, _ in events] == ["task", "stream-error"]
            assert json.loads(events[1][1]) == {"detail": UNEXPECTED}
            assert client.get("/api/tasks", params={"page_size": 1}).status_code == 200
    finally:
        server.stop()
    logged = [r for r in caplog.records if r.name == "console.gateway.events"]
    assert any(task.task_id in r.getMessage() and r.exc_info for r in logged), logged


def test_a_screenshot_download_the_cloud_fails_midway_is_cut_off_and_logged(
    console_settings: ConsoleSettings,
    make_host: HostFactory,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A screenshot streams from the cloud after its status and Content-Length went out, so a
    failure halfway can only close the connection before the last byte (what HTTP offers:
    the client sees an incomplete body, never a whole-looking image). It is logged as a
    warning naming the task, attempt, step and phase; the request's credentials are not in
    the log. (The cloud's stream is wrapped to fail after half the image: a real artifact
    store failing between two chunks cannot be timed from here.)"""
    app = create_app(console_settings)
    server = UvicornThread(app)
    base = server.start()
    host = make_host()
    task = operator.submit(f"screens then fail {uuid.uuid4().hex[:8]}", host_id=host.host_id)
    assignment = host.assignment()
    decision = host.decide(assignment, task.goal)
    image = io.BytesIO()
    Image.new("RGB", (108, 240), "navy").save(image, format="PNG")
    ArtifactServiceStub(host.channel).UploadStepScreenshot(
        artifact_service_pb2.UploadStepScreenshotRequest(
            task_id=assignment.task_id,
            attempt=assignment.attempt,
            lease_id=assignment.lease_id,
            decision_id=decision.decision_id,
            phase=artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
            content_type="image/png",
            data=image.getvalue(),
        ),
        timeout=20,
    )
    cloud = app.state.cloud
    real_chunks = cloud.screenshot_chunks

    def failing_chunks(*args: Any) -> Any:
        async def chunks() -> Any:
            async for chunk in real_chunks(*args):
                half = artifact_service_pb2.GetStepScreenshotResponse()
                half.CopyFrom(chunk)
                half.data = chunk.data[: len(chunk.data) // 2]
                yield half
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    details="artifact store: connection reset",
                )

        return chunks()

    cloud.screenshot_chunks = failing_chunks
    path = f"/api/tasks/{task.task_id}/attempts/1/steps/{decision.step_index}/screens/before"
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=20) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                client.get(path)
            assert client.get("/api/tasks", params={"page_size": 1}).status_code == 200
    finally:
        server.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "console.gateway.api"]
    assert any(task.task_id in line and "step" in line and "before" in line for line in lines), (
        caplog.records
    )
    assert API_TOKEN not in caplog.text


def test_a_chunked_answer_that_fails_midway_is_not_passed_off_as_whole(
    console_settings: ConsoleSettings,
) -> None:
    """A streamed answer without Content-Length (chunked) that fails after its first bytes
    must end without the last chunk, so the client can tell it is cut off. The security
    headers' middleware (Starlette's BaseHTTPMiddleware) ended it properly instead: a client
    took the first half for the whole answer; the failure was raised only after that."""
    app = create_app(console_settings)

    @app.get("/api/half")
    async def half() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"the first half"
            raise RuntimeError("a bug halfway")

        return StreamingResponse(body(), media_type="text/plain")

    server = UvicornThread(app)
    base = server.start()
    try:
        with httpx.Client(base_url=base, timeout=20) as client:
            headers = {"Authorization": f"Bearer {API_TOKEN}"}
            with pytest.raises(httpx.RemoteProtocolError):
                client.get("/api/half", headers=headers)
            assert client.get("/healthz").status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("path", "body", "why"),
    [
        ("/api/tasks", '{"goal": "g"', "Expecting ',' delimiter at character 12"),
        ("/api/tasks", "{goal: 'g'}", "Expecting property name enclosed in double quotes"),
        ("/api/tasks/t/cancel", '{"reason": "r",}', "Expecting property name"),
        ("/api/flows/f/status", '{"active": tru}', "Expecting value at character 11"),
    ],
)
def test_a_body_that_is_not_json_is_a_400_saying_so(
    api: httpx.Client, path: str, body: str, why: str
) -> None:
    """A 422 says the request was read and a value in it refused; a body that does not parse
    was not read at all. It was a 422 whose detail read "12: JSON decode error", the parse
    error's character offset written where a field's name goes, and no word of what was
    wrong; scripts that tell their own bugs (400) from refused values (422) could not."""
    response = api.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["detail"].startswith("request body: not valid JSON: " + why), error
    assert [e["type"] for e in error["errors"]] == ["json_invalid"]
    assert "input" not in error["errors"][0]


def test_the_fleet_stream_can_leave_out_its_snapshot(
    gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """The tasks page opens /api/events right after listing its page of tasks, and the stream
    began with every unfinished task in the cloud: 2,000 queued tasks were 2 MB and 16 s of
    events per page view (and per reconnect) before the first real change, 10,000 five times
    that, for rows the page mostly does not show. With snapshot=false the stream carries only
    what changes from then on (the page refreshes its own rows when the stream (re)opens)."""
    unfinished = operator.submit(unique("Waiting in the queue"), host_id="nowhere")
    host = make_host()
    task = operator.submit(unique("Changes now"), host_id=host.host_id)
    assignment = host.assignment()
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.stream(
        "GET", f"{gateway}/api/events?snapshot=false", headers=headers, timeout=20
    ) as response:
        host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "step 1")
        data = next(d for n, d in sse_events(response) if n == "task")
    first = json.loads(data)
    assert first["task_id"] == task.task_id, "the stream began with its snapshot"
    assert first["task_id"] != unfinished.task_id
    assert first["progress"]["step_index"] == 1


def test_a_stream_begins_only_once_the_cloud_watches(
    console_settings: ConsoleSettings, operator: Operator, make_host: HostFactory
) -> None:
    """A browser's EventSource opens at the stream's response headers: the tasks page says
    "live", fetches its rows again, and from then on relies on the stream, which leaves out
    its snapshot. The gateway sent the headers before it had asked the cloud to watch, so a
    step reported in between was in neither the rows nor the stream: the row showed the older
    step until a reload (the browser test's "step 4 not shown within 10 s" under load). The
    headers now wait for the cloud's, which it sends once it watches. Here the gateway's
    request to the cloud waits in a proxy: the browser must not have heard back meanwhile."""
    cloud_port = int(console_settings.cloud_address.rsplit(":", 1)[1])
    proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
    server = UvicornThread(
        create_app(console_settings.model_copy(update={"cloud_address": proxy.address}))
    )
    base = server.start()
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    host = make_host()
    task = operator.submit(unique("Watched from the start"), host_id=host.host_id)
    assignment = host.assignment()
    try:
        listed = httpx.get(f"{base}/api/tasks", headers=headers, timeout=20)
        assert listed.status_code == 200, listed.text  # the gateway's channel is up
        port = int(base.rsplit(":", 1)[1])
        for stream in ("/api/events?snapshot=false", "/api/hosts/events?snapshot=false"):
            proxy.hold()
            with socket.create_connection(("127.0.0.1", port), timeout=20) as browser:
                request = (
                    f"GET {stream} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Authorization: Bearer {API_TOKEN}\r\nAccept: text/event-stream\r\n\r\n"
                )
                browser.sendall(request.encode())
                assert proxy.held.wait(20), f"{stream}: the gateway never asked the cloud"
                heard, _, _ = select.select([browser], [], [], 0)
                assert not heard, browser.recv(300)  # "HTTP/1.1 200 OK …": the page said "live"
            proxy.release()
        with httpx.stream(
            "GET", f"{base}/api/events?snapshot=false", headers=headers, timeout=20
        ) as response:
            host.renew(assignment, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Dark theme'")
            changes = (json.loads(d) for n, d in sse_events(response) if n == "task")
            mine = next(t for t in changes if t["task_id"] == task.task_id)
        assert mine["progress"]["step_index"] == 2
    finally:
        proxy.release()
        server.stop()
        proxy.stop()


async def _queue_tasks(store: Store, count: int) -> None:
    """`count` tasks queued for a host that never comes, in one transaction."""
    now = store.now()
    async with store.write() as session:
        session.add_all(
            TaskRow(
                task_id=uuid.uuid4().hex,
                goal=f"waiting {n}",
                status=states.QUEUED,
                attempt=0,
                max_attempts=1,
                target_host_id="nowhere",
                lease_seconds=60,
                deadline=now + timedelta(hours=1),
                cancel_requested=False,
                created_at=now,
                updated_at=now,
            )
            for n in range(count)
        )


def test_a_step_written_while_the_cloud_reads_its_snapshot_is_streamed(
    tmp_path: Path, pki_dir: Path, console_settings: ConsoleSettings
) -> None:
    """The cloud sent its headers (the page's "live", then its rows fetched again) before it
    read the snapshot, which the tasks page's stream leaves out. A step written after those
    rows were read but before the cloud read its task for the snapshot was in the snapshot, so
    not sent again as a change (the task "as sent" already had it), and in no row either: the
    row kept its older step. With thousands of unfinished tasks the read takes a while: a
    renewal right after the headers was lost. The headers now wait for the snapshot read."""
    loop = LoopThread("busy-cloud")
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'busy.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        default_lease_seconds=60,
    )
    server = loop.run(build_server(settings))
    loop.run(server.start())
    gateway = UvicornThread(
        create_app(console_settings.model_copy(update={"cloud_address": server.address}))
    )
    base = gateway.start()
    op = Operator(server.address, pki_dir, "tester")
    host_id = f"sim-{uuid.uuid4().hex[:8]}"
    cloud_pki.write_host_cert(pki_dir, host_id)
    host = SimHost(server.address, pki_dir, host_id)
    try:
        host.connect()
        task = op.submit(unique("Watched on a busy fleet"), host_id=host_id)
        assignment = host.assignment()
        host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
        loop.run(_queue_tasks(server.store, 3000))  # read before the watched task: older
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        seen: queue.Queue[dict[str, Any]] = queue.Queue()
        with httpx.stream(
            "GET", f"{base}/api/events?snapshot=false", headers=headers, timeout=30
        ) as response:

            def read() -> None:
                with contextlib.suppress(httpx.HTTPError):
                    for name, data in sse_events(response):
                        change = json.loads(data) if name == "task" else {}
                        if change.get("task_id") == task.task_id:
                            seen.put(change)

            threading.Thread(target=read, daemon=True).start()
            host.renew(assignment, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Dark theme'")
            change = seen.get(timeout=30)
        assert change["progress"]["step_index"] == 2
    finally:
        host.close()
        op.close()
        gateway.stop()
        loop.run(server.stop(0))
        loop.stop()


def test_a_bad_task_status_is_a_422_listing_only_the_statuses_a_filter_takes(
    api: httpx.Client,
) -> None:
    """`unspecified` is what a task of a status this console does not know reads as, not a
    status to filter by: it was listed among the valid values of a bad `status`, and
    `?status=unspecified` itself answered every task, unfiltered."""
    for word in ("bogus", "unspecified"):
        response = api.get("/api/tasks", params={"status": word})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert detail.startswith("status"), detail
        assert "'queued'" in detail and "'cancelled'" in detail
        assert "unspecified" not in detail.replace(f"'{word}'", ""), detail


def test_the_host_filter_includes_queued_tasks_waiting_for_that_host(api: httpx.Client) -> None:
    """The fleet's "tasks on this host →" link is this filter. It took only tasks an attempt
    of which had run on the host: a task queued for it (a busy or offline host's backlog)
    was in no host's list until it started."""
    host = f"waiting-{uuid.uuid4().hex[:8]}"
    goal = unique("Open the settings")
    made = api.post("/api/tasks", json={"goal": goal, "host_id": host})
    assert made.status_code == 201, made.text
    other = api.post("/api/tasks", json={"goal": goal, "host_id": f"{host}-other"})
    assert other.status_code == 201, other.text
    listed = api.get("/api/tasks", params={"host": host}).json()["tasks"]
    assert [t["task_id"] for t in listed] == [made.json()["task"]["task_id"]]


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/api/tasks", "query: at most 2000 characters"),
        ("/api/hosts", "host_query: at most 128 characters"),
    ],
)
def test_an_over_long_search_is_the_cloud_s_refusal_on_every_listing(
    api: httpx.Client, path: str, detail: str
) -> None:
    """The search text's limit is the cloud's: /api/tasks passed an over-long `q` on and
    answered the cloud's words with its gRPC code, while /api/hosts refused one itself with
    pydantic's wording and a validation list, a second copy of the cloud's limit. A script
    reads the same answer from both."""
    response = api.get(path, params={"q": "x" * 2001})
    assert response.status_code == 422, response.text
    assert response.json() == {"detail": detail, "grpc_code": "INVALID_ARGUMENT"}


def test_a_field_the_api_does_not_take_is_a_422_and_nothing_is_queued(api: httpx.Client) -> None:
    """A body field the API does not know was dropped without a word: a misspelt
    "max_attempt": 1 or "max_cost" queued the task with the cloud's defaults, the script told
    201 as if its request had been followed."""
    goal = unique("Unknown fields")
    for extra in ({"max_attempt": 1}, {"max_cost": 0.5}):
        # Pinned to no host of the session's, so a task queued anyway is run by none.
        body = {"goal": goal, "host_id": f"nobody-{uuid.uuid4().hex[:8]}", **extra}
        response = api.post("/api/tasks", json=body)
        assert response.status_code == 422, response.text
        error = response.json()
        name = next(iter(extra))
        assert error["detail"] == f"{name}: Extra inputs are not permitted"
        assert error["errors"][0]["loc"] == ["body", name]
        assert "input" not in error["errors"][0]
    assert api.get("/api/tasks", params={"q": goal}).json()["tasks"] == []
    cancel = api.post("/api/tasks/unknown/cancel", json={"reason": "r", "why": "typo"})
    assert cancel.status_code == 422, cancel.text


def test_a_task_submitted_through_the_api_takes_a_budget(api: httpx.Client) -> None:
    """The JSON API could not set a task's spending caps (the CLI's --max-tokens/--max-cost):
    a script's task ran on the cloud's default budget. `budget` reads as in a task's answer,
    and the cloud's refusal of a bad one is the 422 naming the field."""
    body = {"goal": unique("Budgeted"), "host_id": f"nobody-{uuid.uuid4().hex[:8]}"}
    budget = {"max_tokens": 5000, "max_cost_usd": 2.5}
    made = api.post("/api/tasks", json={**body, "budget": budget})
    assert made.status_code == 201, made.text
    task_id = made.json()["task"]["task_id"]
    assert api.get(f"/api/tasks/{task_id}").json()["task"]["budget"] == budget
    refused = api.post("/api/tasks", json={**body, "budget": {"max_tokens": -1}})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == "budget.max_tokens: 0 (the cloud's default) or more"
    odd = api.post("/api/tasks", json={**body, "budget": {"max_cost": 1}})
    assert odd.status_code == 422 and "budget.max_cost" in odd.json()["detail"], odd.text


def test_a_bad_flow_status_is_a_422_listing_only_the_statuses_a_filter_takes(
    api: httpx.Client,
) -> None:
    """As for tasks: `unspecified` is how a flow status this console does not know reads, not
    a filter. `?status=unspecified` was passed on and refused by the cloud as "statuses:
    unknown value 0", naming neither the parameter's word nor the allowed ones."""
    for word in ("bogus", "unspecified"):
        response = api.get("/api/flows", params={"status": word})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert detail.startswith("status"), detail
        assert "'active'" in detail and "'disabled'" in detail and "'retired'" in detail
        assert "unspecified" not in detail.replace(f"'{word}'", ""), detail


def test_hosts_are_listed_connected_or_disconnected(api: httpx.Client, cloud: Cloud) -> None:
    """/api/hosts?connection=connected|disconnected lists just those hosts, by id, paged:
    at fleet scale the order by id no longer puts the hosts that are down together. An
    unknown value is a 422 naming the allowed ones; `connected_only` is `connected`, and
    contradicts `disconnected`."""
    tag = uuid.uuid4().hex[:8]
    made = []
    for i in range(4):
        host_id = f"cf-{tag}-{i}"
        cloud_pki.write_host_cert(cloud.pki, host_id)
        made.append(SimHost(cloud.address, cloud.pki, host_id))
        made[-1].connect()
    try:
        for host in made[1::2]:
            host.close()
        up, down = [made[0].host_id, made[2].host_id], [made[1].host_id, made[3].host_id]

        def listed(connection: str, **more: Any) -> list[str]:
            seen: list[str] = []
            token = ""
            while True:
                params = {"q": tag, "connection": connection, "page_size": 1, **more}
                body = api.get("/api/hosts", params={**params, "page_token": token}).json()
                seen += [h["host_id"] for h in body["hosts"]]
                token = body["next_page_token"]
                if not token:
                    return seen

        deadline = time.monotonic() + 30
        while listed("disconnected") != down:
            assert time.monotonic() < deadline, listed("disconnected")
            time.sleep(0.05)
        assert listed("connected") == up
        assert listed("any", connected_only=True) == up
        assert listed("any") == sorted(up + down)

        bad = api.get("/api/hosts", params={"connection": "down"})
        assert bad.status_code == 422
        assert "'any', 'connected' or 'disconnected'" in bad.json()["detail"], bad.json()
        both = api.get("/api/hosts", params={"connection": "disconnected", "connected_only": 1})
        assert both.status_code == 422
        assert both.json()["detail"] == "connected_only: contradicts connection=disconnected"
    finally:
        for host in made:
            host.close()
