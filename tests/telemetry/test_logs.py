"""Log fields bound in a context reach every line of that context: asyncio tasks started from
it and worker threads of `asyncio.to_thread`, never a neighbouring task; JSON and text formats."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from planner.settings import PlannerSettings
from planner.vendors.clients import openai_client
from telemetry import logs
from tests.support.tracing import memory_exporter


def _logger(fmt: logs.LogFormat) -> tuple[logging.Logger, io.StringIO]:
    buffer = io.StringIO()
    logger = logging.getLogger(f"tests.telemetry.{fmt}")
    logger.handlers = [logs.handler(fmt, buffer)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, buffer


async def test_bound_fields_follow_tasks_and_worker_threads_but_not_neighbours() -> None:
    logger, buffer = _logger("json")

    async def attempt(task_id: str, step: int) -> None:
        with logs.bound(task_id=task_id, attempt=1, host_id="h1"):
            logger.info("in the task")
            await asyncio.to_thread(logger.info, "in a worker thread")
            with logs.bound(step=step):
                await asyncio.create_task(asyncio.sleep(0))
                logger.info("in a step")
            logger.info("after the step")

    await asyncio.gather(attempt("t1", 3), attempt("t2", 7))
    logger.info("outside")
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    by_message: dict[str, list[dict[str, object]]] = {}
    for line in lines:
        by_message.setdefault(str(line["message"]), []).append(line)
    for message in ("in the task", "in a worker thread", "after the step"):
        assert sorted(str(line["task_id"]) for line in by_message[message]) == ["t1", "t2"]
        assert all("step" not in line for line in by_message[message])
    steps = {line["task_id"]: line["step"] for line in by_message["in a step"]}
    assert steps == {"t1": 3, "t2": 7}
    (outside,) = by_message["outside"]
    assert not set(logs.FIELDS) & set(outside)
    assert {"time", "level", "logger", "message"} <= set(outside)
    assert logs.current() == {}


def test_text_lines_end_with_the_bound_fields_and_a_traceback_stays_below() -> None:
    logger, buffer = _logger("text")
    with logs.bound(task_id="t9", attempt=2, host_id="h1", step=4):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("step failed")
    first, *rest = buffer.getvalue().splitlines()
    assert first.endswith("step failed [task=t9 attempt=2 host=h1 step=4]")
    assert any("ValueError: boom" in line for line in rest)


def test_a_line_inside_a_span_carries_its_trace_and_span_ids() -> None:
    memory_exporter()  # an SDK tracer provider: spans are real
    logger, buffer = _logger("json")
    from telemetry import tracing

    with tracing.span("work") as span:
        logger.info("traced")
    line = json.loads(buffer.getvalue())
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert line["span_id"] == format(span.get_span_context().span_id, "016x")


def test_configure_replaces_only_its_own_handler() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    level = root.level
    try:
        logs.configure(logs.LogSettings(format="json", level="WARNING"), io.StringIO())
        logs.configure(logs.LogSettings(format="text", level="INFO"), io.StringIO())
        ours = [h for h in root.handlers if getattr(h, "_amc_handler", False)]
        assert len(ours) == 1 and isinstance(ours[0].formatter, logs.TextFormatter)
        assert [h for h in root.handlers if h not in ours] == before
        assert root.level == logging.INFO
    finally:
        for h in [h for h in root.handlers if getattr(h, "_amc_handler", False)]:
            root.removeHandler(h)
        root.setLevel(level)


async def test_a_line_never_carries_a_configured_key_or_a_credential_header() -> None:
    """Every line written is scrubbed, its traceback too: an exception's text is a library's
    (a provider's error body quoting the request's headers), and it was written as it came,
    a key of no known shape (a gateway's) in full. Both formats; a JSON line stays JSON."""
    key = "gw4d9e1b7a03c6f25e8d1"
    client = openai_client(PlannerSettings(openai_api_key=key))  # the key the process uses
    await client.close()
    quoted = (
        f"upstream failed: {{'authorization': 'Bearer {key}', 'x-api-key': 'xk7Qm2Lp9Rt4Vw8Z'}}; "
        f"echoed {key} and Authorization: Bearer tok_5f2a9c8e1d7b"
    )
    for fmt in ("text", "json"):
        logger, buffer = _logger(fmt)
        try:
            raise RuntimeError(quoted)
        except RuntimeError as err:
            logger.error("call failed: %s", err, exc_info=True)
        written = buffer.getvalue()
        for secret in (key, "xk7Qm2Lp9Rt4Vw8Z", "tok_5f2a9c8e1d7b"):
            assert secret not in written, (fmt, written)
        assert "upstream failed" in written
        if fmt == "json":
            assert "RuntimeError" in json.loads(written)["exc_info"]


def test_a_line_never_carries_a_secret_any_part_is_configured_with() -> None:
    """Only the provider keys were kept: the database URL's password, the S3 secret key, the
    tasks' secrets key, the console's password, API token and session secret and the host
    console's session secret were masked only where their shape gave them away, so a library
    quoting one bare (libpq's `password=…`, a proxy echoing a form) wrote it in full. Every
    secret field of every part's settings, and the password of any URL they hold, is kept as
    the settings are read."""
    from cloud.settings import CloudSettings
    from console.settings import ConsoleSettings
    from host.console.settings import HostConsoleSettings

    secrets = {
        "database": "pg7Hq2Wn5Zr8Tx",
        "s3": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
        "fernet": "q5Kx3pV8mN2wR7tY4uZ9bC6dF1gH0jL3aS5eW8rT2yU=",
        "admin": "correct-horse-battery",
        "api": "console-api-token-4f9e2b",
        "session": "console-session-secret-7c1d",
        "host session": "host-console-session-9a3e",
    }
    CloudSettings(
        database_url=f"postgresql+psycopg://amc:{secrets['database']}@db.internal/amc",
        artifact_s3_secret_access_key=secrets["s3"],
        secrets_key=secrets["fernet"],
    )
    ConsoleSettings(
        admin_password=secrets["admin"],
        api_token=secrets["api"],
        session_secret=secrets["session"],
    )
    HostConsoleSettings(session_secret=secrets["host session"])
    quoted = "; ".join(f"{name} {value}" for name, value in secrets.items())
    for fmt in ("text", "json"):
        logger, buffer = _logger(fmt)
        try:
            raise RuntimeError(f"host=db.internal user=amc password={secrets['database']}")
        except RuntimeError as err:
            logger.error("a library said: %s", quoted, exc_info=err)
        written = buffer.getvalue()
        for name, secret in secrets.items():
            assert secret not in written, (fmt, name, written)
        assert "a library said" in written and "host=db.internal" in written


def test_a_url_password_is_masked_whoever_configured_it() -> None:
    """A URL's password is masked by its place in the URL too: one too short to keep (a
    database password `amc`), or a URL no settings class holds (a proxy's)."""
    logger, buffer = _logger("text")
    logger.error("cannot reach postgresql://amc:pw4@db/amc or http://proxy:p/ss@10.0.0.1:3128/")
    written = buffer.getvalue()
    assert "pw4" not in written and "p/ss" not in written, written
    assert "postgresql://amc:•••@db/amc" in written and "http://proxy:•••@10.0.0.1:3128/" in written
