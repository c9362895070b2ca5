"""What operators see of a host that said it is stopping: the fleet card and the API say so
(it looked connected with idle phones for the seconds of its stop)."""

from __future__ import annotations

import time
from html import unescape
from typing import Any

import httpx

from amc.v1 import lease_service_pb2
from tests.console.console_stack import WHOLE_FLEET, HostFactory
from tests.console.test_pages import log_in


def _until_stopping(api: httpx.Client, host_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        hosts = api.get("/api/hosts", params={"q": host_id}).json()["hosts"]
        host: dict[str, Any] = next(h for h in hosts if h["host_id"] == host_id)
        if host["stopping_since"] is not None:
            return host
        assert time.monotonic() < deadline, host
        time.sleep(0.05)


def _card(page: str, host_id: str) -> str:
    """The host's card on the fleet page."""
    start = page.index(f'id="host-{host_id}"')
    return page[start : page.index("</section>", start)]


def test_a_stopping_host_is_shown_stopping_on_the_fleet_page(
    make_host: HostFactory, api: httpx.Client, anon: httpx.Client
) -> None:
    host = make_host()
    log_in(anon)
    card = _card(unescape(anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text), host.host_id)
    assert 'data-field="stopping"' not in card and ">connected</span>" in card
    host.send(lease_service_pb2.LeaseRequest(stopping=lease_service_pb2.HostStopping()))
    shown = _until_stopping(api, host.host_id)
    assert shown["connected"]
    card = _card(unescape(anon.get("/fleet", params={"page_size": WHOLE_FLEET}).text), host.host_id)
    assert 'data-field="stopping"' in card and ">stopping</span>" in card
    assert ">connected</span>" not in card
