"""A private PostgreSQL server for the test session.

PostgreSQL refuses to run as root, and the tests run as root here, so the server runs as the
`postgres` OS user (through `runuser`) in a temporary directory it owns, listening on a free
TCP port on 127.0.0.1 and on a unix socket in that directory. `AMC_TEST_POSTGRES_URL` points the
tests at an existing server instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psycopg


def _bin_dirs() -> list[Path]:
    """Debian's versioned server directories, newest first, then /usr/local/bin."""

    def version(p: Path) -> int:
        try:
            return int(p.parent.name)
        except ValueError:
            return 0

    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    return [*found, Path("/usr/local/bin")]


def _binary(name: str) -> str:
    for d in _bin_dirs():
        candidate = d / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"PostgreSQL binary {name!r} not found (apt-get install postgresql)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """A running server; `url(db)` gives a SQLAlchemy URL for one of its databases."""

    host: str
    port: int
    user: str
    password: str
    admin_db: str = "postgres"

    def url(self, database: str) -> str:
        return (
            f"postgresql+psycopg://{self.user}:{self.password}@{self.host}:{self.port}/{database}"
        )

    def _admin_dsn(self) -> str:
        return (
            f"host={self.host} port={self.port} user={self.user} "
            f"password={self.password} dbname={self.admin_db}"
        )

    #: The next database of each template (None: an empty one), being made in `_maker`'s thread
    #: while the test that will get it is still waiting on its predecessor (`create_database`).
    _ahead: dict[str | None, Future[str]] = field(default_factory=dict, repr=False)
    _maker: ThreadPoolExecutor | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def create_database(self, prefix: str = "amc_test", template: str | None = None) -> str:
        """A new database, empty or a copy of the `template` database's URL; returns its
        SQLAlchemy URL. PostgreSQL copies a template file by file, far sooner than migrating a
        database again (see `freeze_template`).

        With the default prefix the database was made ahead, while the test before ran: the
        copy (0.05 s idle, 0.3-0.6 s on a loaded CI machine, most of a PostgreSQL store test's
        setup) then overlaps the earlier test's waits. Each call still gets a database of its
        own that nothing else was given, made the same way; the next one starts at once."""
        if prefix != "amc_test":
            return self._make(prefix, template)
        with self._lock:
            made = self._ahead.pop(template, None)
            if self._maker is None:
                self._maker = ThreadPoolExecutor(1, thread_name_prefix="amc-pg-ahead")
            self._ahead[template] = self._maker.submit(self._make, prefix, template)
        return made.result() if made is not None else self._make(prefix, template)

    def _make(self, prefix: str, template: str | None) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        copy = f' TEMPLATE "{template.rsplit("/", 1)[1]}"' if template else ""
        with psycopg.connect(self._admin_dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copy}')
        return self.url(name)

    def close(self) -> None:
        """Wait for the databases being made ahead and drop them (nobody was given them): a
        server the tests did not start (`AMC_TEST_POSTGRES_URL`) keeps no extra ones."""
        with self._lock:
            ahead, self._ahead = list(self._ahead.values()), {}
            maker, self._maker = self._maker, None
        if maker is not None:
            maker.shutdown(wait=True)
        for made in ahead:
            if made.exception() is None:
                with contextlib.suppress(psycopg.Error):
                    self.drop_database(made.result())

    def freeze_template(self, url: str) -> None:
        """Make the database at `url` a template nothing connects to any more: a copy fails
        while another session is connected to its template."""
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self._admin_dsn(), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )

    def drop_database(self, url: str) -> None:
        """Drop a database made by create_database (terminating leftover connections)."""
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self._admin_dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run_as(user: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = args if os.geteuid() != 0 else ["runuser", "-u", user, "--", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def initdb(os_user: str, data: Path, pwfile: Path) -> None:
    """A new cluster in `data` (as `os_user`), its superuser `amc` with the password in
    `pwfile`, not synced to disk (a test cluster)."""
    _run_as(
        os_user,
        [
            _binary("initdb"),
            "-D",
            str(data),
            "-U",
            "amc",
            "--pwfile",
            str(pwfile),
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        ],
    )


@contextlib.contextmanager
def private_postgres(*, autovacuum: bool = True) -> Iterator[PostgresServer]:
    """Start a throwaway server for the duration of the context.

    `autovacuum=False` is for the test session's server: a test worker's server gathers a
    database per PostgreSQL test (hundreds), and the autovacuum launcher visits every one of
    them each minute, a worker process each (0.5 CPU-s every 20 s at 300 databases, on a
    2-core machine running two such servers), for tables a test fills with a few rows and
    drops with the cluster. Nothing the tests check waits for it (the plan tests ANALYZE
    themselves); the benchmarks keep it, as production does."""
    url = os.environ.get("AMC_TEST_POSTGRES_URL")
    if url:
        external = _from_url(url)
        try:
            yield external
        finally:
            external.close()
        return
    os_user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    base = Path(tempfile.mkdtemp(prefix="amc-pg-"))
    data = base / "data"
    password = uuid.uuid4().hex
    if os.geteuid() == 0:
        pw = pwd.getpwnam(os_user)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    pwfile = base / "pw"
    pwfile.write_text(password)
    if os.geteuid() == 0:
        os.chown(pwfile, pw.pw_uid, pw.pw_gid)
    port = _free_port()
    initdb(os_user, data, pwfile)
    log = base / "server.log"
    options = (
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        + ("" if autovacuum else " -c autovacuum=off")
    )
    _run_as(
        os_user,
        [
            _binary("pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        ],
    )
    server = PostgresServer("127.0.0.1", port, "amc", password)
    try:
        _wait_ready(server)
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.close()
        with contextlib.suppress(Exception):
            _run_as(os_user, [_binary("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"])
        _remove_in_background(base)


def _remove_in_background(folder: Path) -> None:
    """Delete `folder` in a process of its own, not waited for. A test worker's server ends
    with hundreds of databases (one a test, ~8 MB each, 3-4 GB): deleting them was the last
    test's teardown, 19.5 s on a quiet CI machine and 80-100 s on a busy one, and the whole
    run waited on it. A shell starts `rm` in the background and exits at once, so nothing is
    left for this process to reap (`rm` belongs to init from then on)."""
    subprocess.run(
        ["sh", "-c", 'rm -rf -- "$0" >/dev/null 2>&1 &', str(folder)],
        check=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait_ready(server: PostgresServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(server._admin_dsn(), connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _from_url(url: str) -> PostgresServer:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return PostgresServer(
        u.host or "127.0.0.1",
        u.port or 5432,
        u.username or "postgres",
        u.password or "",
        u.database or "postgres",
    )
