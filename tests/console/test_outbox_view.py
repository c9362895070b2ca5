"""What operators see of a host's outbox: the fleet card and the task page say how many items
(and decisions) a host still holds and since when, from the backlog it reports on its stream;
the API carries the same numbers."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from html import unescape

import httpx

from amc.v1 import lease_service_pb2, types_pb2
from tests.console.console_stack import WHOLE_FLEET, HostFactory, Operator
from tests.console.test_pages import log_in


def _report(items: int, decisions: int) -> lease_service_pb2.LeaseRequest:
    backlog = types_pb2.OutboxBacklog(items=items, decisions=decisions)
    backlog.oldest_at.FromDatetime(dt.datetime(2026, 3, 4, 5, 6, 7))
    return lease_service_pb2.LeaseRequest(outbox=backlog)


def _until_reported(api: httpx.Client, host_id: str, items: int) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while True:
        hosts = api.get("/api/hosts", params={"q": host_id}).json()["hosts"]
        host = next(h for h in hosts if h["host_id"] == host_id)
        if host["outbox"] and host["outbox"]["items"] == items:
            return dict(host["outbox"])
        assert time.monotonic() < deadline, host
        time.sleep(0.05)


def test_the_outbox_backlog_is_shown_on_the_fleet_and_task_pages(
    make_host: HostFactory, operator: Operator, api: httpx.Client, anon: httpx.Client
) -> None:
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    task = operator.submit(f"Outbox {uuid.uuid4().hex[:6]}", host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "step one")

    host.send(_report(5, 2))
    outbox = _until_reported(api, host.host_id, 5)
    assert (outbox["decisions"], outbox["oldest_at"]) == (2, "2026-03-04T05:06:07Z")

    log_in(anon)
    fleet = unescape(anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text)
    assert "Outbox: 5 items waiting (2 decisions), the oldest since" in fleet
    page = unescape(anon.get(f"/tasks/{task.task_id}").text)
    assert (
        f"Host {host.host_id} still has 2 decisions and 3 other items (screenshots, outcomes) "
        "in its outbox, the oldest written 2026-03-04 05:06:07 UTC" in page
    )

    host.send(_report(0, 0))  # sent: the notes go away
    _until_reported(api, host.host_id, 0)
    assert "still has" not in anon.get(f"/tasks/{task.task_id}").text
    assert "Outbox: empty" in anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text
