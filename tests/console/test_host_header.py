"""The operators' console answers only to the names it is known by (DNS-rebinding guard): real
HTTP requests to a real uvicorn server, each carrying the Host header a browser would send.

A web page that re-points its own domain at the console's address gets its page's domain in
the Host header; before, the gateway served it (login page, and the JSON API to a bearer
token) as if it were the console's own name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from console.gateway import create_app
from console.gateway.app import unguarded_warning
from console.settings import ConsoleSettings
from tests.console.console_stack import API_TOKEN, UvicornThread

FOREIGN = ["evil.example", "evil.example:8080", "10.0.0.1", "[::2]:80", "127.0.0.1.evil.example"]


@contextmanager
def _gateway(settings: ConsoleSettings) -> Iterator[str]:
    server = UvicornThread(create_app(settings))
    base = server.start()
    try:
        yield base
    finally:
        server.stop()


def _port(base: str) -> str:
    return base.rsplit(":", 1)[1]


@pytest.mark.parametrize("host", FOREIGN)
def test_a_foreign_host_header_is_refused_with_the_setting_to_change(
    gateway: str, host: str
) -> None:
    with httpx.Client(base_url=gateway, timeout=20) as client:
        page = client.get("/login", headers={"host": host})
        api = client.get(
            "/api/tasks", headers={"host": host, "Authorization": f"Bearer {API_TOKEN}"}
        )
    for refused in (page, api):
        assert refused.status_code == 400, (host, refused.status_code)
        assert refused.text.startswith("unknown Host header"), refused.text
        assert "AMC_CONSOLE_ALLOWED_HOSTS" in refused.text
        assert "set-cookie" not in refused.headers  # no session was started for it


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]"])
def test_loopback_names_are_served(gateway: str, host: str) -> None:
    with httpx.Client(base_url=gateway, timeout=20) as client:
        page = client.get("/login", headers={"host": host.format(port=_port(gateway))})
        api = client.get(
            "/api/tasks",
            headers={
                "host": host.format(port=_port(gateway)),
                "Authorization": f"Bearer {API_TOKEN}",
            },
        )
    assert page.status_code == 200
    assert api.status_code == 200, api.text


def test_health_probes_answer_whatever_the_host(gateway: str) -> None:
    """A load balancer's probe carries the address it dialled (a pod's IP), not a name."""
    with httpx.Client(base_url=gateway, timeout=20) as client:
        assert client.get("/healthz", headers={"host": "10.1.2.3:8080"}).status_code == 200
        assert client.get("/readyz", headers={"host": "10.1.2.3:8080"}).status_code == 200


def test_listed_names_from_the_environment_are_served_and_others_still_refused(
    console_settings: ConsoleSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMC_CONSOLE_ALLOWED_HOSTS", "console.lab.example, OPS.example:443")
    listed = ConsoleSettings(**console_settings.model_dump(exclude={"allowed_hosts"}))
    assert listed.allowed_hosts == ["console.lab.example", "OPS.example:443"]
    with _gateway(listed) as base, httpx.Client(base_url=base, timeout=20) as client:
        for host in ("console.lab.example", "console.lab.example:8443", "ops.example"):
            assert client.get("/login", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "lab.example", f"127.0.0.1:{_port(base)}"):
            expected = 200 if host.startswith("127.") else 400
            assert client.get("/login", headers={"host": host}).status_code == expected, host


def test_a_star_opts_out_of_the_guard(
    console_settings: ConsoleSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMC_CONSOLE_ALLOWED_HOSTS", "*")
    anyone = ConsoleSettings(**console_settings.model_dump(exclude={"allowed_hosts"}))
    with _gateway(anyone) as base, httpx.Client(base_url=base, timeout=20) as client:
        assert client.get("/login", headers={"host": "evil.example"}).status_code == 200


def test_the_bind_address_is_a_name_the_console_answers_to(
    console_settings: ConsoleSettings,
) -> None:
    """`bind_host` is what the gateway listens on; a browser given that address sends it."""
    bound = console_settings.model_copy(update={"bind_host": "console.internal"})
    with _gateway(bound) as base, httpx.Client(base_url=base, timeout=20) as client:
        assert client.get("/login", headers={"host": "console.internal:8080"}).status_code == 200
        assert client.get("/login", headers={"host": "evil.example"}).status_code == 400


@pytest.mark.parametrize("bind", ["0.0.0.0", "::"])
def test_a_console_on_every_address_with_no_names_answers_any_and_says_so(
    console_settings: ConsoleSettings, bind: str
) -> None:
    """Bound to every address (a container) it is reached by names it cannot know: refusing
    them would leave a console that answers 400 to everyone after an upgrade. It answers, and
    its start says how to turn the guard on; listing a name turns it on."""
    open_to_all = console_settings.model_copy(update={"bind_host": bind})
    warning = unguarded_warning(open_to_all)
    assert warning is not None and "AMC_CONSOLE_ALLOWED_HOSTS" in warning
    with _gateway(open_to_all) as base, httpx.Client(base_url=base, timeout=20) as client:
        assert client.get("/login", headers={"host": "console.lab.example"}).status_code == 200
    listed = open_to_all.model_copy(update={"allowed_hosts": ["console.lab.example"]})
    assert unguarded_warning(listed) is None
    with _gateway(listed) as base, httpx.Client(base_url=base, timeout=20) as client:
        assert client.get("/login", headers={"host": "console.lab.example"}).status_code == 200
        assert client.get("/login", headers={"host": "evil.example"}).status_code == 400


def test_a_console_on_loopback_or_one_address_is_guarded_without_a_word(
    console_settings: ConsoleSettings,
) -> None:
    assert unguarded_warning(console_settings) is None
    assert unguarded_warning(console_settings.model_copy(update={"bind_host": "10.0.0.5"})) is None


def test_a_console_behind_a_tls_proxy_with_no_names_answers_any_and_says_so(
    console_settings: ConsoleSettings,
) -> None:
    """On loopback behind a TLS proxy on the same machine (`AMC_CONSOLE_COOKIE_SECURE=true`,
    the documented setup) the proxy passes the browser's Host on: an upgrade that refused it
    answered 400 to every operator (found in review)."""
    proxied = console_settings.model_copy(update={"cookie_secure": True})
    warning = unguarded_warning(proxied)
    assert warning is not None and "AMC_CONSOLE_ALLOWED_HOSTS" in warning
    with _gateway(proxied) as base, httpx.Client(base_url=base, timeout=20) as client:
        assert client.get("/login", headers={"host": "console.example.com"}).status_code == 200
    listed = proxied.model_copy(update={"allowed_hosts": ["console.example.com"]})
    assert unguarded_warning(listed) is None
    with _gateway(listed) as base, httpx.Client(base_url=base, timeout=20) as client:
        assert client.get("/login", headers={"host": "console.example.com"}).status_code == 200
        assert client.get("/login", headers={"host": "evil.example"}).status_code == 400
