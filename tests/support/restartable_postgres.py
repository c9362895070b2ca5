"""A PostgreSQL server of one test's own, which the test may stop and start again.

The session's shared server (`tests/support/postgres.py`) must never go down under other tests,
so the fault suite makes its own cluster (same binaries, same `runuser` dance when running as
root) and restarts it at will. Stopping uses `-m immediate`: the closest thing to a crash that
still leaves the data directory reusable.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support.postgres import (
    PostgresServer,
    _binary,
    _free_port,
    _run_as,
    _wait_ready,
    initdb,
)

#: The data folder of a cluster initdb made in this process, and its `amc` role's password.
_cluster: tuple[Path, str] | None = None


def _initialised(os_user: str) -> tuple[Path, str]:
    """A cluster initdb made once per test process (deleted at exit), never started, for each
    `RestartablePostgres` to copy, and its `amc` role's password: initdb's bootstrap ran once
    per test before (about 1 CPU-s, 1-7 s on a loaded machine); a copy of its 39 MB takes a
    fraction of that."""
    global _cluster
    if _cluster is None:
        base = Path(tempfile.mkdtemp(prefix="amc-pg-initdb-"))
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        password = uuid.uuid4().hex
        pwfile = base / "pw"
        pwfile.write_text(password)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(os_user)
            os.chown(base, pw.pw_uid, pw.pw_gid)
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        initdb(os_user, base / "data", pwfile)
        _cluster = (base / "data", password)
    return _cluster


class RestartablePostgres:
    """A private cluster on a fixed port; `stop()` and `start()` as often as needed."""

    def __init__(self) -> None:
        self.os_user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.base = Path(tempfile.mkdtemp(prefix="amc-pg-fault-"))
        self.data = self.base / "data"
        self.port = _free_port()
        self.template, self.password = _initialised(self.os_user)
        self.server = PostgresServer("127.0.0.1", self.port, "amc", self.password)

    def init(self) -> None:
        """The data folder: a copy of the process's one cluster initdb made (`_initialised`),
        copied by the server's OS user, who so owns it."""
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self.os_user)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        _run_as(self.os_user, ["cp", "-a", str(self.template), str(self.data)])

    def _pg_ctl(self, *args: str) -> None:
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=200"
        )
        _run_as(
            self.os_user,
            [
                _binary("pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.base / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                *args,
            ],
        )
        _wait_ready(self.server)

    def start(self) -> None:
        self._pg_ctl("start")

    def restart(self) -> None:
        """`pg_ctl restart -m immediate`: every connection dropped at once, no checkpoint (a
        crash), then the server starts again on the same data and port."""
        self._pg_ctl("-m", "immediate", "restart")

    def stop(self, mode: str = "immediate") -> None:
        _run_as(self.os_user, [_binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def restartable_postgres() -> Iterator[RestartablePostgres]:
    """A running private cluster, removed afterwards."""
    pg = RestartablePostgres()
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.remove()
