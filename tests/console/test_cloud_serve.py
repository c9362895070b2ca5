"""`amc cloud serve` as a newcomer meets it: a real process, configured by environment only.

Up, it says where it listens, which store, which planner and where the certificates came from.
When a setting keeps it from starting it says so in one line naming the setting and the fix,
and the traceback appears only with --debug. The deployment guide's settings table lists every
`AMC_CLOUD_*` setting of the settings class, and every part dials the same default address.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from cloud.server import _missing_sqlite_folder, build_server
from cloud.settings import DEFAULT_CLOUD_ADDRESS, CloudSettings
from console.settings import ConsoleSettings
from host.settings import HostSettings
from tests.support.processes import AMC, _clean_env, free_port, make_pki

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = _clean_env()
    env.update(
        {
            "AMC_CLOUD_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            "AMC_CLOUD_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}",
            "AMC_PLANNER_PROVIDER": "offline",
            # A free port: the default (127.0.0.1:9471) may be taken by a neighbour's run.
            "AMC_CLOUD_METRICS_ADDRESS": "127.0.0.1:0",
            "COLUMNS": "200",
            **settings,
        }
    )
    return env


def _fails(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [AMC, "cloud", "serve", *args], env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout, done.stderr


def _banner(env: dict[str, str]) -> tuple[str, str, str, int]:
    """Start `amc cloud serve`, read its banner, scrape its /metrics if it serves them, stop it
    with SIGTERM: (banner, scrape, what it printed after, exit code)."""
    process = subprocess.Popen(
        [AMC, "cloud", "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    scraped = ""
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # blocks until the banner is printed (or the process ends)
            lines.append(line.rstrip("\n"))
            if "stop with Ctrl-C" in line:
                break
        url = re.search(r"metrics:\s+(http://\S+/metrics)", "\n".join(lines))
        if url:
            scraped = httpx.get(url.group(1), timeout=10).raise_for_status().text
        process.send_signal(signal.SIGTERM)
        rest, _err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return "\n".join(lines), scraped, rest, process.returncode


def test_it_serves_its_metrics_says_where_and_a_taken_port_does_not_stop_it(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki", [])
    banner, scraped, _, code = _banner(_env(tmp_path, AMC_CLOUD_PKI_DIR=str(pki)))
    assert code == 0
    assert re.search(
        r"metrics:\s+http://127\.0\.0\.1:\d+/metrics \(AMC_CLOUD_METRICS_ADDRESS\)", banner
    )
    assert "amc_cloud_lease_streams 0.0" in scraped
    assert "tracing:      off (set OTEL_EXPORTER_OTLP_ENDPOINT" in banner
    assert "logs:         text on stderr" in banner
    assert "budgets:      task default none; fleet daily none" in banner
    assert "prices:       $0 in / $0 out" in banner
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env(
            tmp_path,
            AMC_CLOUD_PKI_DIR=str(pki),
            AMC_CLOUD_METRICS_ADDRESS=f"127.0.0.1:{port}",
            AMC_CLOUD_DAILY_MAX_COST_USD="25",
        )
        banner, scraped, _, code = _banner(env)
    assert code == 0, "a taken metrics port does not keep the replica from serving"
    assert (
        f"metrics:      NOT served: AMC_CLOUD_METRICS_ADDRESS cannot listen on 127.0.0.1:{port}"
        in banner
    )
    assert "fleet daily $25.00" in banner
    assert scraped == ""


def test_it_says_where_it_listens_what_it_uses_and_stops_on_sigterm(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", [])
    env = _env(tmp_path, AMC_CLOUD_PKI_DIR=str(pki))
    address = env["AMC_CLOUD_LISTEN_ADDRESS"]
    process = subprocess.Popen(
        [AMC, "cloud", "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # blocks until the banner is printed (or the process ends)
            lines.append(line.rstrip("\n"))
            if "stop with Ctrl-C" in line:
                break
        process.send_signal(signal.SIGTERM)
        rest, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    banner = "\n".join(lines)
    assert process.returncode == 0, err
    assert f"amc cloud listening on {address} (mTLS" in banner
    assert f"store:        sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}" in banner
    assert "planner:      offline (model amc-offline-heuristic-1, compact mode" in banner
    assert f"certificates: AMC_CLOUD_PKI_DIR={pki} (ca.pem, server.pem, server.key)" in banner
    assert "amc cloud stopping" in rest


async def test_a_password_in_the_database_url_is_not_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    server = await build_server(
        CloudSettings(
            database_url="postgresql+psycopg://amc:s3cret@127.0.0.1:1/amc",
            listen_address="127.0.0.1:0",
            insecure=True,
        )
    )
    try:
        lines = server.describe()
    finally:
        await server.stop(0)
    assert "store:        postgresql+psycopg://amc:***@127.0.0.1:1/amc" in "\n".join(lines)
    assert "s3cret" not in "\n".join(lines)
    assert "plaintext" in lines[0]


async def test_a_password_in_the_s3_endpoint_url_is_not_printed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The start-up lines named the S3 endpoint as configured: with credentials in its URL
    (`http://user:pass@minio:9000`) `amc cloud serve` printed the password on its terminal."""
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    server = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            insecure=True,
            artifact_store="s3",
            artifact_s3_bucket="shots",
            artifact_s3_endpoint_url="http://minio:S3cretXyz12@127.0.0.1:9",
        )
    )
    try:
        lines = "\n".join(server.describe())
    finally:
        await server.stop(0)
    assert "S3cretXyz12" not in lines
    assert "screenshots:  S3 bucket shots at http://minio:•••@127.0.0.1:9" in lines


def test_a_database_in_a_folder_that_does_not_exist_is_one_line_naming_it(
    tmp_path: Path,
) -> None:
    """AMC_CLOUD_DATABASE_URL naming a SQLite file in a folder that does not exist (a typo in
    the path): the start is refused in one line naming the setting and the folder, and nothing
    is made. Before, the folder and an empty fleet database were made in silence."""
    missing = tmp_path / "mistyped"
    url = f"sqlite+aiosqlite:///{missing / 'cloud.sqlite3'}"
    code, _, err = _fails(_env(tmp_path, AMC_CLOUD_INSECURE="1", AMC_CLOUD_DATABASE_URL=url))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("amc cloud serve: AMC_CLOUD_DATABASE_URL: "), err
    assert f"folder {missing} does not exist" in lines[0], err
    assert not missing.exists()


def test_an_sqlite_uri_is_checked_by_its_path(tmp_path: Path) -> None:
    """`?uri=true` URLs (`file:…`) name their file by the URI's path: the folder check read
    `file:/dir` as the folder and refused every such database at start (review of c64abf0b)."""
    here = tmp_path / "db"
    here.mkdir()
    base = "sqlite+aiosqlite:///file:"
    assert _missing_sqlite_folder(f"{base}{here / 'cloud.sqlite3'}?uri=true") is None
    assert _missing_sqlite_folder(f"{base}{here / 'c.sqlite3'}?mode=rwc&uri=true") is None
    memory = f"{base}{tmp_path / 'no' / 'such' / 'mem1'}?mode=memory&cache=shared&uri=true"
    assert _missing_sqlite_folder(memory) is None  # SQLite makes no file for it
    missing = tmp_path / "mistyped"
    url = f"{base}{missing / 'cloud.sqlite3'}?uri=true"
    assert _missing_sqlite_folder(url) == missing


@pytest.mark.parametrize(
    ("settings", "setting", "fix"),
    [
        ({"AMC_CLOUD_DEFAULT_LEASE_SECONDS": "-1"}, "AMC_CLOUD_DEFAULT_LEASE_SECONDS", "-1"),
        ({}, "AMC_CLOUD_PKI_DIR", "amc certs init"),
        ({"AMC_CLOUD_PKI_DIR": "/nowhere/pki"}, "AMC_CLOUD_PKI_DIR", "/nowhere/pki/"),
        (
            {"AMC_CLOUD_INSECURE": "1", "AMC_CLOUD_LISTEN_ADDRESS": "0.0.0.0:50999"},
            "AMC_CLOUD_LISTEN_ADDRESS",
            "loopback",
        ),
        # gRPC bound port -1 as 65535; port 99999 was an "unexpected OverflowError".
        (
            {"AMC_CLOUD_INSECURE": "1", "AMC_CLOUD_LISTEN_ADDRESS": "127.0.0.1:-1"},
            "AMC_CLOUD_LISTEN_ADDRESS",
            "port -1 is out of range (0 to 65535) (got '127.0.0.1:-1')",
        ),
        (
            {"AMC_CLOUD_INSECURE": "1", "AMC_CLOUD_LISTEN_ADDRESS": "127.0.0.1:99999"},
            "AMC_CLOUD_LISTEN_ADDRESS",
            "port 99999 is out of range (0 to 65535)",
        ),
        (
            {"AMC_CLOUD_INSECURE": "1", "AMC_CLOUD_DATABASE_URL": "mysql://x/y"},
            "AMC_CLOUD_DATABASE_URL",
            "postgresql+psycopg://",
        ),
        (  # a typo (no colon): it ended "unexpected ArgumentError", exit 70
            {
                "AMC_CLOUD_INSECURE": "1",
                "AMC_CLOUD_DATABASE_URL": "postgresql+psycopg//a:s3cret@d/a",
            },
            "AMC_CLOUD_DATABASE_URL",
            "not a database URL (SQLAlchemy cannot parse it)",
        ),
        (
            {"AMC_CLOUD_INSECURE": "1", "AMC_PLANNER_MODE": "session"},
            "AMC_PLANNER_MODE",
            "AMC_PLANNER_PROVIDER=anthropic",
        ),
        (
            {"AMC_CLOUD_INSECURE": "1", "AMC_PLANNER_MODE": "chatty"},
            "AMC_PLANNER_MODE",
            "chatty",
        ),
        (
            {"AMC_CLOUD_INSECURE": "1", "AMC_PLANNER_THINKING_DISPLAY": "full"},
            "AMC_PLANNER_THINKING_DISPLAY",
            "Input should be 'summarized' or 'updates' (got 'full')",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("AMC") else "",
)
def test_a_bad_setting_is_one_line_naming_it(
    tmp_path: Path, settings: dict[str, str], setting: str, fix: str
) -> None:
    code, _, err = _fails(_env(tmp_path, **settings))
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"amc cloud serve: {setting}:"), err
    assert fix in lines[0]
    assert lines[0].endswith("(run with --debug for the traceback)")
    assert "s3cret" not in err


@pytest.mark.parametrize(
    ("command", "settings", "line"),
    [
        (
            "cloud",
            {"AMC_CLOUD_INSECURE": "1", "AMC_PLANNER_THINKING": "budget"},
            "amc cloud serve: thinking=budget needs AMC_PLANNER_THINKING_BUDGET_TOKENS; fix the "
            "variables or unset them to use the defaults (see docs/deployment.md)",
        ),
        (
            "console",
            {"AMC_CONSOLE_ADMIN_PASSWORD": "pw", "AMC_CONSOLE_TLS_CERT_FILE": "/etc/c.pem"},
            "amc console serve: set both AMC_CONSOLE_TLS_CERT_FILE and AMC_CONSOLE_TLS_KEY_FILE, "
            "or neither (fix the variables or unset them to use the defaults)",
        ),
    ],
)
def test_a_check_across_settings_names_the_variables_not_settings_and_value_error(
    tmp_path: Path, command: str, settings: dict[str, str], line: str
) -> None:
    """A check that spans settings used to read "AMC_PLANNER_(SETTINGS): Value error, …" (or
    AMC_CONSOLE_) with the fields' Python names; its message names the variables itself."""
    done = subprocess.run(
        [AMC, command, "serve"],
        env=_env(tmp_path, **settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[0].removesuffix(" (run with --debug for the traceback)")
        == line
    ), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_password_that_is_not_utf8_is_refused_without_showing_it(tmp_path: Path) -> None:
    """A Latin-1 byte in AMC_CONSOLE_ADMIN_PASSWORD: the message for text that is not UTF-8
    quoted it ("'hunter\\xe92secret' is not UTF-8 text"); only the command line's text is
    quoted, a setting's never."""
    settings = {
        "AMC_CONSOLE_ADMIN_PASSWORD": "hunter\udce92secret",  # the bytes b"hunter\xe92secret"
        "AMC_CONSOLE_CERTS_DIR": str(tmp_path),
        "AMC_CONSOLE_BIND_PORT": str(free_port()),
    }
    done = subprocess.run(
        [AMC, "console", "serve"],
        env=_env(tmp_path, **settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("amc console serve: a setting or file holds text that is not")
    assert "hunter" not in done.stderr and "secret" in done.stderr  # "…may be a secret"


def test_console_serve_logs_through_the_handler_every_command_uses(tmp_path: Path) -> None:
    """`amc console serve` installed no log handler and left uvicorn its own logging config:
    AMC_LOG_FORMAT=json got uvicorn's plain `INFO:     …` lines on stderr and its access log
    on stdout, the console's own lines (below WARNING) went nowhere, and nothing it wrote was
    scrubbed of the secrets it was configured with. Every line is now the process handler's."""
    port = free_port()
    settings = {
        "AMC_LOG_FORMAT": "json",
        "AMC_CONSOLE_ADMIN_PASSWORD": "correct-horse-42",
        "AMC_CONSOLE_CERTS_DIR": str(make_pki(tmp_path / "pki", [])),
        "AMC_CONSOLE_OPERATOR_NAME": "ops",
        "AMC_CONSOLE_BIND_PORT": str(port),
        "AMC_CONSOLE_CLOUD_ADDRESS": "127.0.0.1:1",
    }
    process = subprocess.Popen(
        [AMC, "console", "serve"],
        env=_env(tmp_path, **settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:  # blocks until uvicorn says it serves (or the process ends)
            lines.append(line)
            if "Uvicorn running" in line:
                break
        assert httpx.get(f"http://127.0.0.1:{port}/login", timeout=10).status_code == 200
        process.send_signal(signal.SIGTERM)
        out, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    written = [line for line in [*lines, *rest.splitlines()] if line.strip()]
    assert out == ""
    records = [json.loads(line) for line in written]
    messages = [r["message"] for r in records]
    assert any("console gateway talks to the cloud at 127.0.0.1:1" in m for m in messages)
    assert any('"GET /login HTTP/1.1" 200' in m for m in messages), messages


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_an_api_key_with_a_line_break_is_refused_naming_it_without_showing_it(
    tmp_path: Path, vendor: str
) -> None:
    """A key read from a file with its trailing newline (a Kubernetes secret made from a file):
    the cloud started, its first call failed in the HTTP library ("Illegal header value
    b'Bearer <the key>\\n'"), read as "cannot reach OpenAI (Connection error.)": dispatch held
    as if the provider were down, the task waiting for an outage that was never there, and
    the provider probe's traceback in the log quoting the whole key."""
    setting = f"AMC_PLANNER_{vendor.upper()}_API_KEY"
    key = "k3y" + secrets.token_hex(16)
    settings = {"AMC_CLOUD_INSECURE": "1", "AMC_PLANNER_PROVIDER": vendor, setting: key + "\n"}
    code, out, err = _fails(_env(tmp_path, **settings))
    assert code == 2, err
    assert err.startswith(f"amc cloud serve: {setting}: "), err
    assert "line break" in err and len(err.strip().splitlines()) == 1
    assert key not in out + err


@pytest.mark.parametrize(
    ("setting", "value"), [("AMC_LOG_LEVEL", "verbose"), ("AMC_LOG_FORMAT", "xml")]
)
@pytest.mark.parametrize("command", [["cloud", "serve"], ["host", "run"]], ids=" ".join)
def test_a_bad_log_setting_is_one_line_naming_it(
    tmp_path: Path, command: list[str], setting: str, value: str
) -> None:
    """AMC_LOG_LEVEL=verbose was "unexpected ValueError: Unknown level: 'VERBOSE'", exit 70
    (an internal error, no setting named), and AMC_LOG_FORMAT=xml read "FORMAT: Input should
    be 'text' or 'json'": neither said which variable to fix."""
    done = subprocess.run(
        [AMC, *command],
        env=_env(tmp_path, **{setting: value}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"amc {' '.join(command)}: {setting}: "), lines[0]
    assert repr(value) in lines[0]


def test_a_taken_port_names_the_listen_address(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env(tmp_path, AMC_CLOUD_INSECURE="1", AMC_CLOUD_LISTEN_ADDRESS=f"127.0.0.1:{port}")
        code, _, err = _fails(env)
    assert code == 2
    assert err.startswith("amc cloud serve: AMC_CLOUD_LISTEN_ADDRESS: cannot listen on"), err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    # Port 0: a free port picked beforehand can be taken by a neighbour before the cloud binds
    # it, and that refusal (seen once under load) would come before the one this test expects.
    code, _, err = _fails(_env(tmp_path, AMC_CLOUD_LISTEN_ADDRESS="127.0.0.1:0"), "--debug")
    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert "amc cloud serve: AMC_CLOUD_PKI_DIR:" in err


def test_every_part_dials_the_address_the_cloud_listens_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console import cli

    # No `amc up` is running (no context file): the operator commands dial the default.
    monkeypatch.setenv("AMC_CONTEXT_FILE", str(tmp_path / "none.json"))
    cli.global_options(cloud=None, pki_dir=None, operator=None, debug=False)
    assert cli._connection is not None
    assert CloudSettings.model_fields["listen_address"].default == DEFAULT_CLOUD_ADDRESS
    assert HostSettings.model_fields["cloud_address"].default == DEFAULT_CLOUD_ADDRESS
    assert ConsoleSettings.model_fields["cloud_address"].default == DEFAULT_CLOUD_ADDRESS
    assert cli._connection.address == DEFAULT_CLOUD_ADDRESS


def _documented() -> dict[str, str]:
    """The settings table of docs/deployment.md: name -> default cell."""
    section = DOCS.read_text().split("## Settings (`AMC_CLOUD_…`)", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(AMC_CLOUD_[A-Z0-9_]+)` \| ([^|]+) \|", section, re.M)
    return {name: default.strip().strip("`") for name, default in rows}


def _shown(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_deployment_guide_lists_every_cloud_setting_with_its_default() -> None:
    documented = _documented()
    fields = {
        f"AMC_CLOUD_{name.upper()}": _shown(field.default)
        for name, field in CloudSettings.model_fields.items()
    }
    assert sorted(documented) == sorted(fields)
    assert documented == fields


async def test_a_password_given_as_a_query_parameter_is_not_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """libpq and SQLAlchemy also take the password as a query parameter (`?password=…`, the
    form some secret managers write): SQLAlchemy's `hide_password` hides only the one before
    the `@`, and the banner's store line printed this one whole on every start."""
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    server = await build_server(
        CloudSettings(
            database_url="postgresql+psycopg://amc@127.0.0.1:1/amc?password=Qu3ry:S3cret&sslmode=disable",
            listen_address="127.0.0.1:0",
            insecure=True,
        )
    )
    try:
        lines = "\n".join(server.describe())
    finally:
        await server.stop(0)
    assert "S3cr" not in lines
    assert (
        "store:        postgresql+psycopg://amc@127.0.0.1:1/amc?password=•••&sslmode=disable"
        in lines
    )


def test_a_database_it_cannot_open_is_named_without_a_query_password(tmp_path: Path) -> None:
    """The "cannot open the database" line of `amc cloud serve` and of `amc certs revoke`."""
    url = "postgresql+psycopg://amc@127.0.0.1:1/amc?sslpassword=K3yPass&password=Qu3ryS3cret"
    code, _, err = _fails(_env(tmp_path, AMC_CLOUD_INSECURE="1", AMC_CLOUD_DATABASE_URL=url))
    assert code == 2, err
    assert "cannot open the database postgresql+psycopg://amc@127.0.0.1:1/amc?" in err, err
    assert "Qu3ryS3cret" not in err and "K3yPass" not in err, err
    done = subprocess.run(
        [AMC, "certs", "revoke", "--host", "h1"],
        env=_env(tmp_path, AMC_CLOUD_DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "cannot open the database" in done.stderr, done.stderr
    assert "Qu3ryS3cret" not in done.stderr and "K3yPass" not in done.stderr, done.stderr


def test_a_provider_without_its_key_is_a_setting_not_an_unexpected_error(tmp_path: Path) -> None:
    """The most common first start's mistake read "unexpected PlannerAuthError", the words kept
    for amc's own bugs."""
    code, _, err = _fails(_env(tmp_path, AMC_CLOUD_INSECURE="1", AMC_PLANNER_PROVIDER="anthropic"))
    assert code == 2, err
    assert err.strip().splitlines() == [
        "amc cloud serve: planner: no Anthropic API key configured (set "
        "AMC_PLANNER_ANTHROPIC_API_KEY); or run without a model: AMC_PLANNER_PROVIDER=offline "
        "(run with --debug for the traceback)"
    ], err


@pytest.mark.parametrize("case", ["missing", "not PEM", "another key"])
def test_console_tls_files_it_cannot_use_name_the_setting(tmp_path: Path, case: str) -> None:
    """uvicorn loads the files only as it serves: a typo'd path said "unexpected
    FileNotFoundError: [Errno 2] No such file or directory" (no file named), a file that is no
    PEM "unexpected SSLError: [SSL] PEM lib", both exit 70, the code for amc's own bugs."""
    pki = make_pki(tmp_path / "pki", [])
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    cert, key = {
        "missing": (tmp_path / "nowhere.pem", pki / "server.key"),
        "not PEM": (tmp_path / "bad.pem", tmp_path / "bad.pem"),
        "another key": (pki / "server.pem", pki / "ca.key"),
    }[case]
    done = subprocess.run(
        [AMC, "console", "serve"],
        env=_env(
            tmp_path,
            AMC_CONSOLE_ADMIN_PASSWORD="pw",
            AMC_CONSOLE_BIND_PORT="0",
            AMC_CONSOLE_TLS_CERT_FILE=str(cert),
            AMC_CONSOLE_TLS_KEY_FILE=str(key),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[0].startswith("amc console serve: AMC_CONSOLE_TLS_CERT_FILE: "), done.stderr
    assert "unexpected" not in done.stderr
    assert str(cert) in lines[0], done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "sqlite+aiosqlite://",
        "sqlite+aiosqlite:///:memory:",
        "sqlite+aiosqlite:///file::memory:?cache=shared&uri=true",
        "sqlite+aiosqlite:///file:demo?mode=memory&cache=shared&uri=true",
        "sqlite+aiosqlite:///file:/data/cloud.sqlite3?vfs=memdb&uri=true",
    ],
)
def test_an_in_memory_database_is_refused_in_one_line(tmp_path: Path, url: str) -> None:
    """An in-memory SQLite database cannot hold a cloud (each connection its own database, all
    of it gone at the stop): the start is refused in one line saying so and what to use for a
    throwaway cloud. Before, `sqlite://` and `:memory:` ended in a TypeError about pool
    arguments, and `file::memory:?cache=shared` served from a database that vanished."""
    code, _, err = _fails(_env(tmp_path, AMC_CLOUD_INSECURE="1", AMC_CLOUD_DATABASE_URL=url))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("amc cloud serve: AMC_CLOUD_DATABASE_URL: an in-memory"), err
    assert "TypeError" not in err and "temporary folder" in err, err


def test_a_mode_rw_uri_refuses_a_missing_file(tmp_path: Path) -> None:
    """A `mode=rw` URI opens an existing database only (SQLite refuses a missing file):
    naming one that is not there is refused at start, naming the file, and none is made.
    Before, an empty file was made for it first."""
    db = tmp_path / "cloud.sqlite3"
    url = f"sqlite+aiosqlite:///file:{db}?mode=rw&uri=true"
    code, _, err = _fails(_env(tmp_path, AMC_CLOUD_INSECURE="1", AMC_CLOUD_DATABASE_URL=url))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"database file {db} does not exist" in lines[0], err
    assert not db.exists()


@pytest.mark.parametrize("query", ["mode=ro", "immutable=1"])
@pytest.mark.parametrize("exists", [True, False])
def test_a_read_only_uri_is_refused_saying_a_cloud_writes(
    tmp_path: Path, query: str, exists: bool
) -> None:
    """A cloud writes to its database from its first moment, so a read-only URI (`mode=ro`,
    `immutable=1`) can never serve: refused at start saying so, whether the file exists or
    not, and none is made. Before, an existing file failed as "attempt to write a readonly
    database; the database file or its folder is read-only" (sending the operator after file
    permissions), and a missing one as a missing file."""
    db = tmp_path / "cloud.sqlite3"
    if exists:
        sqlite3.connect(db).close()
    url = f"sqlite+aiosqlite:///file:{db}?{query}&uri=true"
    code, _, err = _fails(_env(tmp_path, AMC_CLOUD_INSECURE="1", AMC_CLOUD_DATABASE_URL=url))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "opens the database read-only" in lines[0], err
    assert "drop mode=ro / immutable=1" in lines[0], err
    assert db.exists() == exists
