"""Console sessions end on the server, password guessing is throttled, cookies go HTTPS-only
under TLS — on the operators' console served by a real uvicorn server (each test its own, so
throttling state never leaks between tests).

Proves: after logout, a copy of the old session cookie is refused (pages redirect to /login,
the API answers 401), and a live stream opened with that session ends within seconds instead of
streaming on (after logout and after expiry alike); after `free` failed logins a user, or a
client address, must wait — a throttled attempt gets 429 with Retry-After and the password is
not even checked (no scrypt hash is paid for it), other users and addresses are unaffected, and
once the wait is over (a controllable clock) a correct password works and clears the count; the
throttle's delays double up to their cap; wrong API bearer tokens are throttled per address
the same way (429 as JSON), valid ones never; with a TLS certificate the gateway serves HTTPS and
its cookie carries `Secure` and every answer Strict-Transport-Security (and without one
neither, unless asked to for the cookie).
"""

from __future__ import annotations

import io
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from amc.v1 import artifact_service_pb2
from amc.v1.artifact_service_pb2_grpc import ArtifactServiceStub
from cloud import pki as cloud_pki
from console.gateway.app import SESSION_COOKIE, build_server, create_app
from console.settings import ConsoleSettings
from tests.console.console_stack import (
    ADMIN,
    API_TOKEN,
    PASSWORD,
    HostFactory,
    Operator,
    UvicornThread,
)
from tests.console.test_pages import csrf_of
from webui.throttle import LoginThrottle, install_throttle


class Clock:
    """A clock the test moves (the throttle's waits pass without sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """The gateway's credentials, counting how often a password or token was actually checked."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.checks = 0
        self.token_checks = 0

    def login_role(self, username: str, password: str) -> str | None:
        self.checks += 1
        role: str | None = self.inner.login_role(username, password)  # type: ignore[attr-defined]
        return role

    def token_role(self, token: str) -> str | None:
        self.token_checks += 1
        role: str | None = self.inner.token_role(token)  # type: ignore[attr-defined]
        return role

    def role_of(self, user: str) -> str:
        role: str = self.inner.role_of(user)  # type: ignore[attr-defined]
        return role


class Held(Counting):
    """The gateway's credentials, holding each password check (blocking, as scrypt does) until
    the test lets it go."""

    def __init__(self, inner: object) -> None:
        super().__init__(inner)
        self.checking = threading.Event()
        self.release = threading.Event()

    def login_role(self, username: str, password: str) -> str | None:
        self.checking.set()
        self.release.wait(30)
        return super().login_role(username, password)


@pytest.fixture
def own_gateway(console_settings: ConsoleSettings) -> Iterator[tuple[str, object]]:
    app = create_app(console_settings)
    server = UvicornThread(app)
    base = server.start()
    try:
        yield base, app
    finally:
        server.stop()


def _client(base: str, address: str = "127.0.0.1", **kwargs: object) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address, verify=kwargs.pop("verify", True))  # type: ignore[arg-type]
    return httpx.Client(
        base_url=base,
        follow_redirects=False,
        timeout=20,
        transport=transport,
        **kwargs,  # type: ignore[arg-type]
    )


def _try(client: httpx.Client, username: str, password: str) -> httpx.Response:
    token = csrf_of(client.get("/login").text)
    return client.post(
        "/login",
        data={"username": username, "password": password, "csrf_token": token, "next": "/tasks"},
    )


def test_logout_ends_the_session_on_the_server(own_gateway: tuple[str, object]) -> None:
    base, _ = own_gateway
    with _client(base) as person:
        assert _try(person, ADMIN, PASSWORD).status_code == 303
        stolen = person.cookies.get(SESSION_COOKIE)
        assert stolen
        logout_token = csrf_of(person.get("/tasks").text)
        assert person.post("/logout", data={"csrf_token": logout_token}).status_code == 303
    with _client(base) as replay:
        replay.cookies.set(SESSION_COOKIE, stolen)
        page = replay.get("/tasks")
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        assert replay.get("/api/tasks").status_code == 401


def test_a_screenshot_is_kept_by_no_cache_and_refused_after_logout(
    own_gateway: tuple[str, object], make_host: HostFactory, operator: Operator
) -> None:
    """Screenshots were served `private, max-age=3600`: after logging out, the shared browser
    showed them again from its cache for an hour, no login asked. Now the answer forbids any
    cache to keep it, and the URL asked again after logout is refused."""
    base, _ = own_gateway
    host = make_host()
    task = operator.submit(f"screens then log out {uuid.uuid4().hex[:8]}", host_id=host.host_id)
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
    path = f"/api/tasks/{task.task_id}/attempts/1/steps/{decision.step_index}/screens/before"
    with _client(base) as person:
        assert _try(person, ADMIN, PASSWORD).status_code == 303
        shown = person.get(path)
        assert shown.status_code == 200 and shown.content == image.getvalue()
        assert shown.headers["cache-control"] == "no-store"
        logout_token = csrf_of(person.get("/tasks").text)
        assert person.post("/logout", data={"csrf_token": logout_token}).status_code == 303
        again = person.get(path)
        assert again.status_code == 401
        assert again.content != image.getvalue()
        assert again.headers["cache-control"] == "no-store"


def test_checking_a_password_does_not_stall_the_console(
    own_gateway: tuple[str, object],
) -> None:
    """The password hash runs in a worker thread: while one login is being checked, other
    requests (pages, streams, health) are answered at once, not after it."""
    base, app = own_gateway
    held = Held(app.state.credentials)  # type: ignore[attr-defined]
    app.state.credentials = held  # type: ignore[attr-defined]
    with _client(base) as person, _client(base) as other:
        login = threading.Thread(target=_try, args=(person, ADMIN, PASSWORD))
        login.start()
        try:
            assert held.checking.wait(10), "the login never reached the password check"
            # Answered while the check is still held: a check on the event loop would hold
            # this request until the check ends, which only happens after it (a ReadTimeout).
            assert other.get("/healthz").status_code == 200
            assert not held.release.is_set()
        finally:
            held.release.set()
            login.join()


@pytest.mark.parametrize("ending", ["logout", "expiry"])
def test_a_live_stream_ends_with_its_session(
    console_settings: ConsoleSettings, operator: Operator, make_host: HostFactory, ending: str
) -> None:
    """Task changes made after the session ended never reach the stream opened with it; the
    stream closes (before the fix it went on until the browser left)."""
    max_age = 3 if ending == "expiry" else 3600
    server = UvicornThread(
        create_app(console_settings.model_copy(update={"session_max_age_s": max_age}))
    )
    base = server.start()
    host = make_host()
    goal = f"after the session {uuid.uuid4().hex[:8]}"
    try:
        with _client(base) as person:
            assert _try(person, ADMIN, PASSWORD).status_code == 303
            logout_token = csrf_of(person.get("/tasks").text)
            with person.stream("GET", "/api/events", timeout=10) as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                assert next(lines) == "retry: 1000"
                started = time.monotonic()
                if ending == "logout":
                    person.post("/logout", data={"csrf_token": logout_token})
                else:
                    time.sleep(max_age + 0.5)
                operator.submit(goal, host_id=host.host_id)
                rest = list(lines)  # ends by itself, or ReadTimeout after 10 s
            assert time.monotonic() - started < max_age + 5
            assert not [line for line in rest if goal in line]
    finally:
        server.stop()


def test_failed_logins_are_throttled_per_user_and_per_address(
    own_gateway: tuple[str, object],
) -> None:
    base, app = own_gateway
    clock = Clock()
    throttle = install_throttle(app, LoginThrottle(free=5, base_s=1.0, cap_s=60.0, clock=clock))  # type: ignore[arg-type]
    counting = Counting(app.state.credentials)  # type: ignore[attr-defined]
    app.state.credentials = counting  # type: ignore[attr-defined]

    with _client(base) as guesser:
        for _ in range(5):
            assert _try(guesser, ADMIN, "wrong").status_code == 401
        assert counting.checks == 5
        # The sixth attempt waits, even with the right password, and costs no hash.
        refused = _try(guesser, ADMIN, PASSWORD)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "Too many failed attempts. Try again in 1 s." in refused.text
        assert counting.checks == 5
        assert guesser.get("/tasks").status_code == 303  # not logged in

    # The same user from another address: throttled too (per user).
    with _client(base, "127.0.0.2") as elsewhere:
        assert _try(elsewhere, ADMIN, PASSWORD).status_code == 429
        # Another user from there is not.
        assert _try(elsewhere, "someone-else", "wrong").status_code == 401

    # One address trying many user names is throttled by its address.
    with _client(base, "127.0.0.3") as sprayer:
        for i in range(5):
            assert _try(sprayer, f"user{i}", "wrong").status_code == 401
        assert _try(sprayer, "user-new", "wrong").status_code == 429

    # Once the wait is over, the right password works and clears the count.
    clock.now += 1.0
    with _client(base) as owner:
        assert _try(owner, ADMIN, PASSWORD).status_code == 303
        assert owner.get("/tasks").status_code == 200
    assert throttle.retry_after([f"login:user:{ADMIN}", "login:addr:127.0.0.1"]) == 0


class Gate(Counting):
    """The gateway's credentials, holding every password check (blocking, as scrypt does)
    until the test lets them go, and counting how many are held."""

    def __init__(self, inner: object) -> None:
        super().__init__(inner)
        self.held = 0
        self._lock = threading.Lock()
        self.release = threading.Event()

    def login_role(self, username: str, password: str) -> str | None:
        with self._lock:
            self.held += 1
        self.release.wait(30)
        return super().login_role(username, password)


def test_guesses_sent_at_once_are_throttled_like_guesses_in_a_row(
    own_gateway: tuple[str, object],
) -> None:
    """The password check (scrypt, ~70 ms) runs in a worker thread, and a wrong one counted
    only once it had ended: every guess sent before the first answer passed the throttle, so
    a script sending its guesses at once had all of them checked (and paid a hash for each).
    An attempt counts from the moment its password is checked: of 8 guesses sent together,
    5 are checked and 3 are refused (429) while those 5 are still being checked."""
    base, app = own_gateway
    install_throttle(app, LoginThrottle(free=5, base_s=1.0, cap_s=60.0, clock=Clock()))  # type: ignore[arg-type]
    gate = Gate(app.state.credentials)  # type: ignore[attr-defined]
    app.state.credentials = gate  # type: ignore[attr-defined]
    statuses: list[int] = []

    def guess() -> None:
        with _client(base) as guesser:
            statuses.append(_try(guesser, ADMIN, "wrong").status_code)

    threads = [threading.Thread(target=guess) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        # Every guess is either held in its check or answered: the 429s came back while the
        # checks were held (no check has ended, so none of them was counted the old way).
        deadline = time.monotonic() + 20
        while gate.held + len(statuses) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(statuses) == [429, 429, 429]
        assert gate.held == 5
    finally:
        gate.release.set()
        for thread in threads:
            thread.join(30)
    assert sorted(statuses) == [401] * 5 + [429] * 3
    assert gate.checks == 5


def test_bearer_token_guesses_are_throttled_per_address(
    own_gateway: tuple[str, object],
) -> None:
    """A wrong API token counts against the client's address like a wrong password: after
    `free` of them the address waits (429, Retry-After, the API's JSON error shape) and the
    token it sends is not even checked, the right one included. Valid tokens never count: a
    client that only sends the right one is never slowed, and other addresses are unaffected."""
    base, app = own_gateway
    clock = Clock()
    install_throttle(app, LoginThrottle(free=5, base_s=1.0, cap_s=60.0, clock=clock))  # type: ignore[arg-type]
    counting = Counting(app.state.credentials)  # type: ignore[attr-defined]
    app.state.credentials = counting  # type: ignore[attr-defined]

    def tasks(client: httpx.Client, token: str) -> httpx.Response:
        return client.get("/api/tasks", headers={"Authorization": f"Bearer {token}"})

    with _client(base, "127.0.0.4") as script:
        for _ in range(8):
            assert tasks(script, API_TOKEN).status_code == 200
    with _client(base) as guesser:
        for i in range(5):
            assert tasks(guesser, f"guess-{i}").status_code == 401
        checked = counting.token_checks
        for token in ("guess-5", API_TOKEN):
            refused = tasks(guesser, token)
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["content-type"] == "application/json"
            assert refused.json() == {"detail": "Too many failed attempts. Try again in 1 s."}
        assert counting.token_checks == checked
    with _client(base, "127.0.0.4") as script:
        assert tasks(script, API_TOKEN).status_code == 200

    # Once the wait is over, the right token works (and clears the address's count).
    clock.now += 1.0
    with _client(base) as owner:
        assert tasks(owner, API_TOKEN).status_code == 200
        assert tasks(owner, "guess-6").status_code == 401
        assert tasks(owner, API_TOKEN).status_code == 200


def test_wrong_tokens_and_wrong_passwords_are_throttled_apart(
    own_gateway: tuple[str, object],
) -> None:
    """Wrong bearer tokens and wrong passwords counted against one key per address: behind a
    reverse proxy (one address for every client) a script sending a stale token locked the
    operators out of the login page (429 before their password was even checked), and an
    operator mistyping a password five times the scripts out of the API. Each kind now has its
    own keys: one address exhausting either still gets the other checked."""
    base, app = own_gateway
    clock = Clock()
    install_throttle(app, LoginThrottle(free=5, base_s=1.0, cap_s=60.0, clock=clock))  # type: ignore[arg-type]

    def tasks(client: httpx.Client, token: str) -> httpx.Response:
        return client.get("/api/tasks", headers={"Authorization": f"Bearer {token}"})

    with _client(base, "127.0.0.5") as proxy:
        for i in range(5):
            assert tasks(proxy, f"stale-{i}").status_code == 401
        assert tasks(proxy, API_TOKEN).status_code == 429  # the tokens' own wait
        assert _try(proxy, ADMIN, PASSWORD).status_code == 303  # an operator still logs in
    with _client(base, "127.0.0.6") as proxy:
        for _ in range(5):
            assert _try(proxy, "someone", "mistyped").status_code == 401
        assert _try(proxy, "someone-else", "mistyped").status_code == 429
        assert tasks(proxy, API_TOKEN).status_code == 200  # a script's token still works


def test_the_throttle_doubles_its_wait_up_to_its_cap() -> None:
    clock = Clock()
    throttle = LoginThrottle(free=2, base_s=1.0, cap_s=8.0, clock=clock)
    keys = ["addr:x"]
    waits = []
    for _ in range(7):
        throttle.failed(keys)
        waits.append(throttle.retry_after(keys))
    assert waits == [0, 1, 2, 4, 8, 8, 8]
    throttle.succeeded(keys)
    assert throttle.retry_after(keys) == 0
    # Forgotten a cap after the last failure, once its wait is over.
    throttle.failed(keys)
    clock.now += 8.0
    throttle.failed(["addr:other"])
    assert "addr:x" not in throttle._keys


def test_an_accounts_delay_outlives_many_addresses_and_made_up_users() -> None:
    """Guesses at alice from one address earn her account a delay; then a script fails from
    many addresses, each naming a made-up user, more than the throttle keeps. Alice's delay
    stands, for an attempt from any address: with one table of keys, least recently failed
    forgotten first, the churn pushed it out and the guessing at alice went on at full speed.
    Each table stays bounded, forgetting a key that delays no one first."""
    clock = Clock()
    throttle = LoginThrottle(free=2, base_s=1.0, cap_s=60.0, max_keys=10, clock=clock)
    for _ in range(4):
        throttle.failed(["login:addr:10.0.0.1", "login:user:alice"])
    wait = throttle.retry_after(["login:user:alice"])
    assert wait == 4
    for n in range(50):
        throttle.failed([f"login:addr:10.1.0.{n}", f"login:user:made-up-{n}"])
    assert throttle.retry_after(["login:addr:10.9.9.9", "login:user:alice"]) == wait
    assert throttle.retry_after(["login:addr:10.0.0.1"]) == wait  # delaying: kept too
    assert len(throttle._keys) == 10  # the idle addresses went instead


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("console-tls")
    cloud_pki.init_ca(directory)
    cloud_pki.write_server_cert(directory)
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"


@pytest.mark.parametrize(
    ("tls", "cookie_secure", "secure"),
    [(True, None, True), (False, None, False), (False, True, True), (True, False, False)],
    ids=["tls", "plain", "plain-behind-a-tls-proxy", "tls-told-otherwise"],
)
def test_secure_cookies_follow_tls(
    console_settings: ConsoleSettings,
    tls_files: tuple[Path, Path, Path],
    tls: bool,
    cookie_secure: bool | None,
    secure: bool,
) -> None:
    ca, cert, key = tls_files
    update: dict[str, object] = {"bind_port": 0, "cookie_secure": cookie_secure}
    if tls:
        update |= {"tls_cert_file": cert, "tls_key_file": key}
    settings = ConsoleSettings(**(console_settings.model_dump() | update))
    server = UvicornThread(server=build_server(settings))
    base = server.start()
    try:
        assert base.startswith("https://" if tls else "http://")
        with _client(base, verify=ssl.create_default_context(cafile=str(ca))) as person:
            # The login form already starts a session (for its CSRF token).
            login = person.get("/login")
            cookie = login.headers["set-cookie"].lower()
            assert cookie.startswith(SESSION_COOKIE)
            assert ("; secure" in cookie) is secure
            # A console serving HTTPS itself tells browsers never to use plain HTTP for it (a
            # proxy in front says so itself): the password is never posted in the clear.
            for answer in (login, person.get("/healthz"), person.get("/api/tasks")):
                hsts = answer.headers.get("strict-transport-security")
                assert hsts == ("max-age=31536000" if tls else None), answer.url
            if tls:
                assert _try(person, ADMIN, PASSWORD).status_code == 303
                assert person.get("/tasks").status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("bind_host", "tls", "cookie_secure", "warned"),
    [
        ("0.0.0.0", False, None, True),
        ("0.0.0.0", True, None, False),
        ("0.0.0.0", False, True, False),
        ("127.0.0.1", False, None, False),
        ("localhost", False, None, False),
    ],
    ids=["plain-on-every-address", "tls", "behind-a-tls-proxy", "loopback", "localhost"],
)
def test_a_plain_http_login_on_the_network_is_said_at_start(
    console_settings: ConsoleSettings,
    tls_files: tuple[Path, Path, Path],
    caplog: pytest.LogCaptureFixture,
    bind_host: str,
    tls: bool,
    cookie_secure: bool | None,
    warned: bool,
) -> None:
    _ca, cert, key = tls_files
    update: dict[str, object] = {"bind_host": bind_host, "cookie_secure": cookie_secure}
    if tls:
        update |= {"tls_cert_file": cert, "tls_key_file": key}
    settings = ConsoleSettings(**(console_settings.model_dump() | update))
    with caplog.at_level(logging.WARNING, logger="console.gateway.app"):
        build_server(settings)
    said = [r.getMessage() for r in caplog.records if "plain HTTP" in r.getMessage()]
    if warned:
        assert len(said) == 1, said
        assert "0.0.0.0" in said[0] and "AMC_CONSOLE_TLS_CERT_FILE" in said[0], said
        assert "AMC_CONSOLE_COOKIE_SECURE=true" in said[0], said
    else:
        assert said == []


def test_tls_needs_both_files(console_settings: ConsoleSettings, tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="both AMC_CONSOLE_TLS_CERT_FILE and AMC_CONSOLE_TLS_KEY_FILE"
    ):
        ConsoleSettings(**(console_settings.model_dump() | {"tls_cert_file": tmp_path / "c"}))


def test_a_full_table_of_delaying_keys_does_not_stop_a_new_accounts_count() -> None:
    """Both tables full of keys that delay (a script kept them failing): a new account named
    from new addresses still earns its delay after `free` guesses. Forgetting "a key that
    delays no one" first dropped the key just counted (its count still below `free`), so the
    guessing at it went on unthrottled (review of 1a602c2b)."""
    clock = Clock()
    throttle = LoginThrottle(free=2, base_s=1.0, cap_s=60.0, max_keys=10, clock=clock)
    for n in range(10):
        for i in range(4):
            throttle.failed([f"login:addr:10.1.{n}.{i}", f"login:user:made-up-{n}"])
    assert all(throttle.retry_after([f"login:user:made-up-{n}"]) > 0 for n in range(10))
    guesses = 0
    for i in range(20):  # up to twenty wrong passwords for bob, each from a new address
        if throttle.retry_after([f"login:addr:10.2.0.{i}", "login:user:bob"]) > 0:
            break
        throttle.failed([f"login:addr:10.2.0.{i}", "login:user:bob"])
        guesses += 1
    assert guesses == 2, f"{guesses} guesses at bob before a delay"
    assert len(throttle._accounts) == 10


def test_an_accounts_delay_outlives_a_flood_behind_many_delaying_keys() -> None:
    """Alice's account delays; a script makes more keys delay than a full table's first look
    covers, then floods made-up users. Her delay stands while any key delays no one: looking
    only at the least recently failed keys dropped it (review of fc38cc57)."""
    clock = Clock()
    throttle = LoginThrottle(free=5, base_s=1.0, cap_s=300.0, max_keys=200, clock=clock)
    for _ in range(9):
        throttle.failed(["login:user:alice"])
    wait = throttle.retry_after(["login:user:alice"])
    assert wait == 16
    for d in range(70):
        for _ in range(6):
            throttle.failed([f"login:user:decoy-{d}"])
    for n in range(200):
        throttle.failed([f"login:user:made-up-{n}"])
    assert throttle.retry_after(["login:user:alice"]) == wait
    assert len(throttle._accounts) == 200
