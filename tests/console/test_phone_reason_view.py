"""Why a host keeps a plugged-in phone out of work (`Device.reason`) reaches the operators:
the fleet page (live, in Chromium), the JSON API and `amc host list`. The console showed
such a phone "offline" and nothing more, while the host's own console said why.

The host is simulated over the real LeaseService against the real cloud; it says why as the
Python host does (an OFFLINE phone with a reason), and a host that says no reason (the Node
host) still shows its phone, without one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Playwright, expect, sync_playwright

from amc.v1 import lease_service_pb2, types_pb2
from tests.console.console_stack import WHOLE_FLEET, Cloud, HostFactory
from tests.console.test_browser_live import LIVE_MS, log_in, mark_no_reload
from tests.support.browser import PageReport, open_browser

pytestmark = pytest.mark.browser

AMC = str(Path(sys.executable).with_name("amc"))
WHY = "phone emu-1 is unhealthy: its screen could not be read in 3 attempts in a row"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        playwright: Playwright = p
        yield from open_browser(playwright)


def _phones(host_id: str, reason: str) -> lease_service_pb2.LeaseRequest:
    offline = types_pb2.Device(
        serial="emu-1",
        model="amc virtual phone",
        state=types_pb2.DEVICE_STATE_OFFLINE,
        reason=reason,
    )
    return lease_service_pb2.LeaseRequest(
        device_update=lease_service_pb2.DeviceUpdate(devices=[offline])
    )


def _phone(api: httpx.Client, host_id: str, reason: str) -> dict[str, Any]:
    """The host's phone as the API shows it, once it is offline with `reason`."""
    deadline = time.monotonic() + 20
    while True:
        hosts = api.get("/api/hosts", params={"q": host_id}).json()["hosts"]
        (device,) = next(h for h in hosts if h["host_id"] == host_id)["devices"]
        if device["state"] == "offline" and device["reason"] == reason:
            return dict(device)
        assert time.monotonic() < deadline, device
        time.sleep(0.05)


def _host_list(cloud: Cloud) -> str:
    connection = ["--cloud", cloud.address, "--pki-dir", str(cloud.pki), "--operator", "tester"]
    done = subprocess.run(
        [AMC, *connection, "host", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400", "AMC_CONTEXT_FILE": "/nonexistent/amc-context"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_unhealthy_phone_shows_why_on_the_fleet_page_the_api_and_the_cli(
    browser: Browser, gateway: str, api: httpx.Client, make_host: HostFactory, cloud: Cloud
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    report = PageReport(context.new_page())
    try:
        page = report.page
        log_in(page, gateway, f"/fleet?page_size={WHOLE_FLEET}")
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        mark_no_reload(page)
        host = make_host()
        row = page.locator(f"#host-{host.host_id} tr[data-serial='emu-1']")
        expect(row).to_contain_text("online", timeout=LIVE_MS)
        expect(row.locator("[data-field=reason]")).to_have_count(0)

        host.send(_phones(host.host_id, WHY))
        assert _phone(api, host.host_id, WHY)["reason"] == WHY
        expect(row.locator("[data-field=reason]")).to_have_text(WHY, timeout=LIVE_MS)
        expect(row).to_contain_text("offline")
        assert page.evaluate("window.__amcNoReload") == "still here"  # patched live
        page.reload()
        expect(row.locator("[data-field=reason]")).to_have_text(WHY)
        assert f"emu-1 (amc virtual phone, offline: {WHY}) idle" in _host_list(cloud)

        host.send(_phones(host.host_id, ""))  # a host that says no reason (the Node host)
        assert _phone(api, host.host_id, "")["reason"] == ""
        expect(row.locator("[data-field=reason]")).to_have_count(0, timeout=LIVE_MS)
        expect(row).to_contain_text("offline")
        assert "emu-1 (amc virtual phone, offline) idle" in _host_list(cloud)
        report.assert_clean()
    finally:
        context.close()
