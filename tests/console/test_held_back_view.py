"""What operators see of a host the cloud holds new work back from (a lease of it ran out while
its stream stayed open: it may be frozen): the fleet card and the API say so and why, until the
host is heard from."""

from __future__ import annotations

import time
import uuid
from html import unescape
from typing import Any

import httpx

from amc.v1 import lease_service_pb2, types_pb2
from tests.console.console_stack import WHOLE_FLEET, HostFactory
from tests.console.test_pages import log_in


def _until(api: httpx.Client, host_id: str, *, held: bool) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        hosts = api.get("/api/hosts", params={"q": host_id}).json()["hosts"]
        host: dict[str, Any] = next(h for h in hosts if h["host_id"] == host_id)
        if (host["held_back"] is not None) == held:
            return host
        assert time.monotonic() < deadline, host
        time.sleep(0.05)


def test_a_host_held_back_is_shown_on_the_fleet_page_until_it_is_heard_from(
    make_host: HostFactory, api: httpx.Client, anon: httpx.Client
) -> None:
    host = make_host()
    goal = f"Held back {uuid.uuid4().hex[:6]}"
    body = {"goal": goal, "host_id": host.host_id, "lease_duration_s": 5}
    task = api.post("/api/tasks", json=body).json()["task"]
    host.assignment()
    assert _until(api, host.host_id, held=False)["held_back"] is None
    host.expect("revoked")  # silent: the lease ran out on its open stream

    hold = _until(api, host.host_id, held=True)["held_back"]
    assert (hold["task_id"], hold["attempt"]) == (task["task_id"], 1)
    assert hold["since"] < hold["until"]
    assert "ran out at" in hold["reason"] and "may be frozen" in hold["reason"]
    log_in(anon)
    fleet = unescape(anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text)
    assert f"No new task for this host: {hold['reason']}." in fleet

    # Heard from again: the hold ends (and attempt 2 comes to it).
    host.send(lease_service_pb2.LeaseRequest(outbox=types_pb2.OutboxBacklog()))
    assert host.assignment().attempt == 2
    _until(api, host.host_id, held=False)
    assert (
        "No new task for this host"
        not in anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text
    )
