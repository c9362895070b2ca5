"""The pieces under the boundary, without a server: `cloud.wire` and `cloud.store.errors`.

Proves: text checks reach nested and repeated fields and name them; the sanitised summaries get
U+FFFD and are kept; a parse failure names the field whose bytes are not UTF-8, at any depth,
or else the message type; a database error is classified as unavailable or not through the
exceptions it was raised from, and described by type and SQLSTATE without its text.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import exc as sa_exc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import task_service_pb2, types_pb2
from cloud import wire
from cloud.store import errors


def test_text_checks_name_nested_and_repeated_fields() -> None:
    hello = lease_pb.LeaseRequest(
        hello=lease_pb.HostHello(
            devices=[types_pb2.Device(serial="ok"), types_pb2.Device(serial="b\x00d")],
        )
    )
    assert wire.check_text(hello) == "hello.devices[1].serial: NUL characters are not allowed"
    request = task_service_pb2.ListTasksRequest(
        statuses=[types_pb2.TASK_STATUS_QUEUED], query="fine", host_id="h\x00"
    )
    assert wire.check_text(request) == "host_id: NUL characters are not allowed"
    assert wire.check_text(task_service_pb2.SubmitTaskRequest(goal="all fine ✓")) is None


def test_summaries_are_sanitised_in_place() -> None:
    result = lease_pb.LeaseRequest(
        result=lease_pb.TaskResult(
            task_id="t", summary="a\x00b", final_progress=types_pb2.Progress(summary="\x00")
        )
    )
    assert wire.check_text(result) is None
    assert result.result.summary == "a\ufffdb"
    assert result.result.final_progress.summary == "\ufffd"
    # ...but not the result's other text.
    result.result.task_id = "t\x00"
    assert wire.check_text(result) == "result.task_id: NUL characters are not allowed"


def test_parse_failures_name_the_field_or_the_type() -> None:
    parse = wire.parser(lease_pb.LeaseRequest.FromString)
    good = lease_pb.LeaseRequest(
        hello=lease_pb.HostHello(devices=[types_pb2.Device(serial="AAAA")])
    ).SerializeToString()
    bad = good.replace(b"AAAA", b"A\xffAA")
    assert parse(bad) == wire.Malformed("hello.devices[0].serial: not valid UTF-8")
    assert parse(b"\x0a\xff") == wire.Malformed("request: not a valid amc.v1.LeaseRequest message")
    assert wire.parser(lambda raw: 1 / 0)(b"") == wire.Malformed("request: not a valid message")
    assert isinstance(parse(good), lease_pb.LeaseRequest)


def _wrapped(orig: BaseException) -> sa_exc.DBAPIError:
    return sa_exc.OperationalError("SELECT secret FROM t WHERE x = %(x)s", {"x": "p"}, orig)


def test_a_sqlite_statement_that_is_wrong_is_no_unavailable_database(tmp_path: Path) -> None:
    """SQLite raises a wrong statement ("no such column", a syntax error) as OperationalError
    too, which read as "the database is unavailable": a background write failing so retried a
    bug for as long as it was wanted, never the ERROR a bug gets. A busy database still is."""
    file = tmp_path / "s.sqlite3"
    holder, other = sqlite3.connect(file), sqlite3.connect(file, timeout=0)
    holder.execute("CREATE TABLE t (x)")
    holder.commit()
    wrong: list[sqlite3.Error] = []
    for sql in ("SELECT nope FROM t", "SELEC 1", "INSERT INTO gone VALUES (1)"):
        with pytest.raises(sqlite3.OperationalError) as caught:
            other.execute(sql)
        wrong.append(caught.value)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as busy:
        other.execute("INSERT INTO t VALUES (1)")
    holder.rollback()
    holder.close()
    other.close()
    for error in wrong:
        assert not errors.unavailable(error), error
        assert not errors.unavailable(_wrapped(error)), error
    assert errors.unavailable(busy.value) and errors.unavailable(_wrapped(busy.value))


def test_database_errors_are_told_apart_without_their_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = _wrapped(psycopg.OperationalError('connection to server at "10.0.0.7", port 5433'))
    locked = sqlite3.OperationalError("database is locked")
    constraint = sa_exc.IntegrityError("INSERT …", {"goal": "secret goal"}, Exception("dup"))
    chained = RuntimeError("while handling")
    chained.__cause__ = down
    assert errors.unavailable(chained)
    assert errors.unavailable(down) and errors.unavailable(locked)
    assert not errors.unavailable(constraint)
    assert not errors.unavailable(ValueError("no database here"))
    assert errors.describe(down) == "OperationalError (psycopg.OperationalError)"
    log = logging.getLogger("test.errors")
    with caplog.at_level(logging.DEBUG):
        errors.report(log, "step %s failed", down, "x")
        errors.report(log, "step %s failed", constraint, "y")
    # Only this logger's records: another test's replica, still stopping in this worker, logs
    # its own queries (aiosqlite's DEBUG lines) into the same capture.
    records = [r for r in caplog.records if r.name == log.name]
    text = "\n".join(r.getMessage() for r in records)
    assert "step x failed: database unavailable: OperationalError" in text
    assert "step y failed: database error: IntegrityError" in text
    for leak in ("10.0.0.7", "5433", "SELECT", "secret", "INSERT"):
        assert leak not in text
    assert all(r.exc_info is None for r in records)
