"""Serving the console beside a running host, in the host's own event loop.

A real host (`build_host`: virtual phones behind the virtual adb server, the adbutils driver,
the lease stream over mTLS to the in-test LeaseService of tests/host/lease_fake.py) runs an
assignment while the console, served by uvicorn on 127.0.0.1 port 0 in the same loop, shows
it live; the refusal to listen on a public address is checked before anything binds.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from host.console import (
    ConsoleServer,
    HostConsoleSettings,
    RemoteBindRefused,
    build_console_server,
    check_bind_address,
    serve_console,
)
from host.runner import build_host, run_host, serve_host, start_virtual_phones
from host.settings import HostSettings
from tests.host.console.host_console_support import (
    CSRF_RE,
    DARK,
    HOST_ID,
    WITHIN_S,
    Filled,
    Gate,
    host_settings,
)
from tests.host.lease_fake import RunningCloud, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner


def _console(**overrides: Any) -> HostConsoleSettings:
    values: dict[str, Any] = {"bind_port": 0, "poll_interval_s": 0.2} | overrides
    return HostConsoleSettings(**values)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_addresses_are_allowed(host: str) -> None:
    check_bind_address(host, allow_remote=False)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "no-such-host.invalid", ""]
)
def test_public_addresses_are_refused_without_the_flag(host: str) -> None:
    with pytest.raises(RemoteBindRefused, match="allow-remote"):
        check_bind_address(host, allow_remote=False)
    check_bind_address(host, allow_remote=True)


async def test_serve_console_refuses_0000_before_binding(filled: Filled) -> None:
    with pytest.raises(RemoteBindRefused, match="not a loopback address"):
        await serve_console(filled.state, _console(bind_host="0.0.0.0"))
    # With the explicit flag it builds (it is not started here: no public port in tests).
    server = build_console_server(filled.state, _console(bind_host="0.0.0.0", allow_remote=True))
    assert server.settings.allow_remote


async def _log_in(client: httpx.AsyncClient, token: str) -> httpx.Response:
    page = await client.get("/login")
    match = CSRF_RE.search(page.text)
    assert match
    return await client.post("/login", data={"token": token, "csrf_token": match.group(1)})


async def test_serve_console_prints_url_and_token_and_stops_on_stop(
    filled: Filled, tmp_path: Path
) -> None:
    """Also: after each login the next token is printed (the issue: "after the first login no
    new token is ever printed"), and the console says where it serves in its token folder,
    for `amc host token`, until it stops."""
    from host.console.login_token import issue, served_url

    lines: list[str] = []
    ready: asyncio.Future[ConsoleServer] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    tokens = tmp_path / "console-tokens"
    serving = asyncio.create_task(
        serve_console(
            filled.state,
            _console(token_dir=tokens),
            stop=stop,
            announce=lines.append,
            ready=ready.set_result,
        )
    )
    server = await asyncio.wait_for(ready, WITHIN_S)
    assert server.url.startswith("http://127.0.0.1:")
    assert served_url(tokens) == server.url
    token = server.login_token.current
    assert any(server.url in line and token in line for line in lines)
    assert any(server.login_url in line for line in lines)
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/now")).status_code == 303
        assert (await _log_in(client, token)).status_code == 303
        assert (await client.get("/tasks")).status_code == 200
    assert lines[-1] == f"host console: a login token was used; the next login: {server.login_url}"
    assert server.login_token.current != token
    async with httpx.AsyncClient(base_url=server.url) as second:
        assert (await _log_in(second, issue(tokens))).status_code == 303
    assert len([line for line in lines if "a login token was used" in line]) == 2
    stop.set()
    await asyncio.wait_for(serving, WITHIN_S)
    assert serving.done()
    assert served_url(tokens) is None


async def test_the_access_log_never_holds_a_login_token(filled: Filled) -> None:
    """At log level info uvicorn logs every request with its query: the printed login link
    (`/login?token=…`) put a working login token in the host's log."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    keep = Keep()
    ready: asyncio.Future[ConsoleServer] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    serving = asyncio.create_task(
        serve_console(
            filled.state,
            _console(log_level="info"),
            stop=stop,
            announce=lambda _: None,
            ready=ready.set_result,
        )
    )
    server = await asyncio.wait_for(ready, WITHIN_S)
    logging.getLogger("uvicorn.access").addHandler(keep)
    try:
        token = server.login_token.current
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.get(f"/login?next=%2Ftasks&token={token}")
            await _until(lambda: _true(bool(records)), "the request in the access log")
    finally:
        logging.getLogger("uvicorn.access").removeHandler(keep)
        stop.set()
        await asyncio.wait_for(serving, WITHIN_S)
    assert not any(token in line for line in records), records
    assert any("/login?next=%2Ftasks&token=…" in line for line in records), records


async def _true(value: bool) -> bool:
    return value


async def test_a_taken_port_is_an_error_not_an_exit(filled: Filled) -> None:
    ready: asyncio.Future[ConsoleServer] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    first = asyncio.create_task(
        serve_console(
            filled.state, _console(), stop=stop, announce=lambda _: None, ready=ready.set_result
        )
    )
    port = (await asyncio.wait_for(ready, WITHIN_S)).port
    try:
        with pytest.raises(OSError, match="in use"):
            await serve_console(filled.state, _console(bind_port=port), announce=lambda _: None)
    finally:
        stop.set()
        await first


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll `check` (as the page's script does) until it holds, within a generous bound."""
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never saw {what}")
        await asyncio.sleep(0.1)


async def test_now_shows_a_running_task_live_on_a_real_host(tmp_path: Path) -> None:
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    try:
        await _now_live(tmp_path, cloud)
    finally:
        await cloud.server.stop(grace=None)


async def _now_live(tmp_path: Path, cloud: RunningCloud) -> None:
    virtual, settings = start_virtual_phones(host_settings(tmp_path, cloud.port, cloud.pki_dir))
    planner = Gate(list(DARK))
    app = build_host(settings, planner=planner)
    stop = asyncio.Event()
    ready: asyncio.Future[ConsoleServer] = asyncio.get_running_loop().create_future()
    host = asyncio.create_task(serve_host(app, stop))
    console = asyncio.create_task(
        serve_console(app, _console(), stop=stop, announce=lambda _: None, ready=ready.set_result)
    )
    fake = cloud.cloud
    try:
        server = await asyncio.wait_for(ready, WITHIN_S)
        await asyncio.wait_for(app.lease.wait_connected(), WITHIN_S)
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await _log_in(client, server.login_token.current)).status_code == 303
            page = await client.get("/now")
            assert page.status_code == 200
            assert f"connected to the cloud as {HOST_ID}" in page.text
            assert "emulator-5554" in page.text
            assert "emulator-5556" in page.text

            async def fragment() -> str:
                response = await client.get("/now/phones")
                assert response.status_code == 200
                return response.text

            await fake.assign("live-1", "emulator-5556", "Turn on dark theme")

            async def planning_step_2() -> bool:
                html = await fragment()
                row = html[html.index('data-serial="emulator-5556"') :]
                return "live-1" in row and "step 2 · planning" in row

            await _until(planning_step_2, "step 2 planning on emulator-5556")
            html = await fragment()
            idle = html[
                html.index('data-serial="emulator-5554"') : html.index(
                    'data-serial="emulator-5556"'
                )
            ]
            assert "idle" in idle

            planner.opened.set()
            await fake.wait_for(lambda: len(fake.results) == 1, within=WITHIN_S)

            async def idle_again() -> bool:
                return "live-1" not in await fragment()

            await _until(idle_again, "the phone idle again")
            tasks = await client.get("/tasks")
            assert 'data-task-id="live-1"' in tasks.text
            timeline = await client.get("/tasks/live-1")
            assert timeline.text.count('class="step card"') == 4
            srcs = re.findall(r'<img src="([^"]+)"', timeline.text)
            assert len(srcs) == 8
            for src in srcs:
                shot = await client.get(src)
                assert shot.status_code == 200
                assert shot.content.startswith(b"\x89PNG")
    finally:
        planner.opened.set()
        stop.set()
        await host
        await console
        virtual.stop()


async def test_run_host_serves_the_console_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner hook: `run_host(..., console=...)` prints the console's URL and token."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    settings = host_settings(tmp_path, cloud.port, cloud.pki_dir)
    stop = asyncio.Event()
    running = asyncio.create_task(
        run_host(settings, stop, planner=ScriptedPlanner(list(DARK)), console=_console())
    )
    try:
        url = ""
        token = ""
        deadline = asyncio.get_running_loop().time() + WITHIN_S
        while not url:
            assert asyncio.get_running_loop().time() < deadline, "no console line printed"
            assert not running.done(), running
            found = re.search(
                r"host console: (http://127\.0\.0\.1:\d+)\s+\(one-time login token: (\S+)\)",
                capsys.readouterr().err,
            )
            if found:
                url, token = found.group(1), found.group(2)
            else:
                await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await _log_in(client, token)).status_code == 303
            assert (await client.get("/now")).status_code == 200
    finally:
        stop.set()
        await asyncio.wait_for(running, WITHIN_S)
        await cloud.server.stop(grace=None)


async def test_run_host_refuses_a_public_console_before_starting(tmp_path: Path) -> None:
    settings = HostSettings(data_dir=tmp_path / "host", ocr_enabled=False, adb_port=1)
    with pytest.raises(RemoteBindRefused):
        await run_host(
            settings,
            asyncio.Event(),
            planner=ScriptedPlanner(list(DARK)),
            console=_console(bind_host="0.0.0.0"),
        )
