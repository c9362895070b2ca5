"""Small pure parts of the console: settings, credentials, history reasons, badges, mapping."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2
from pydantic import SecretStr, ValidationError

from amc.v1 import fleet_service_pb2, task_service_pb2, types_pb2
from console import formatting, watching
from console.cli import _event_word
from console.embedded import _console_password, _secrets_key_file
from console.gateway.auth import Credentials
from console.gateway.cloud import health_word
from console.gateway.errors import UNREACHABLE, describe, http_status
from console.gateway.history import (
    DIRECT_TRANSPORT,
    NO_DECISION_YET,
    NO_STEP_YET,
    NOT_ASSIGNED_YET,
    group_history,
)
from console.gateway.models import DecisionOut, ScreenOut, SpendOut, TaskOut
from console.gateway.overlay import overlay
from console.gateway.pages import PAGES
from console.gateway.present import attempt_label, progress_badge
from console.settings import ConsoleSettings
from planner.describe import describe as describe_action


def test_settings_read_the_environment_and_derive_cert_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AMC_CONSOLE_ADMIN_PASSWORD", "hunter2-but-longer")
    monkeypatch.setenv("AMC_CONSOLE_CERTS_DIR", str(tmp_path))
    monkeypatch.setenv("AMC_CONSOLE_OPERATOR_NAME", "ops")
    monkeypatch.setenv("AMC_CONSOLE_CLOUD_ADDRESS", "cloud.example:443")
    settings = ConsoleSettings()
    assert settings.cloud_address == "cloud.example:443"
    assert settings.tls_files() == (
        tmp_path / "ca.pem",
        tmp_path / "operator-ops.pem",
        tmp_path / "operator-ops.key",
    )
    assert settings.bind_host == "127.0.0.1"
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings.model_dump())


def test_settings_refuse_empty_or_weak_secrets() -> None:
    with pytest.raises(ValidationError):
        ConsoleSettings(admin_password=SecretStr(""))
    with pytest.raises(ValidationError):
        ConsoleSettings(admin_password=SecretStr("pw"), api_token=SecretStr("short"))
    with pytest.raises(ValidationError):
        ConsoleSettings(admin_password=SecretStr("pw"), session_secret=SecretStr("short"))


def test_settings_without_certificates_say_what_to_set() -> None:
    settings = ConsoleSettings(admin_password=SecretStr("pw"))
    with pytest.raises(ValueError, match="AMC_CONSOLE_CERTS_DIR"):
        settings.tls_files()


def test_credentials_compare_hashes() -> None:
    creds = Credentials("admin", SecretStr("s3cret"), SecretStr("token-0123456789abcdef"))
    assert creds.check_login("admin", "s3cret")
    assert not creds.check_login("admin", "S3cret")
    assert not creds.check_login("root", "s3cret")
    assert creds.check_token("token-0123456789abcdef")
    assert not creds.check_token("token-0123456789abcdeF")
    assert not Credentials("a", SecretStr("b"), None).check_token("")
    assert "s3cret" not in repr(vars(creds))


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.INVALID_ARGUMENT, 422),
        (grpc.StatusCode.FAILED_PRECONDITION, 409),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.PERMISSION_DENIED, 502),
        (grpc.StatusCode.INTERNAL, 502),
    ],
)
def test_grpc_codes_map_to_http(code: grpc.StatusCode, status: int) -> None:
    assert http_status(code) == status


def _task(*attempts: types_pb2.Attempt) -> TaskOut:
    return TaskOut.of(
        types_pb2.Task(task_id="t1", goal="g", max_attempts=3, attempts=list(attempts))
    )


def _attempt(
    n: int, transport: types_pb2.PlannerTransport.ValueType, step: int = 0, host: str = "h1"
) -> types_pb2.Attempt:
    return types_pb2.Attempt(
        attempt=n,
        host_id=host,
        planner_transport=transport,
        progress=types_pb2.Progress(step_index=step),
    )


def _decision(attempt: int, step: int) -> DecisionOut:
    return DecisionOut.of(
        types_pb2.Decision(
            decision_id=f"d{attempt}{step}", task_id="t1", attempt=attempt, step_index=step
        )
    )


def test_empty_histories_say_why() -> None:
    history, note = group_history(_task(), [], {})
    assert (history, note) == ([], NOT_ASSIGNED_YET)

    direct = _task(_attempt(1, types_pb2.PLANNER_TRANSPORT_DIRECT, step=4))
    history, note = group_history(direct, [], {})
    assert history[0].empty_reason == note == DIRECT_TRANSPORT

    cloud = _task(_attempt(1, types_pb2.PLANNER_TRANSPORT_CLOUD))
    assert group_history(cloud, [], {})[1] == NO_STEP_YET
    planning = _task(_attempt(1, types_pb2.PLANNER_TRANSPORT_CLOUD, step=1))
    assert group_history(planning, [], {})[1] == NO_DECISION_YET

    # An attempt that did not record its transport falls back to the host's current one.
    unknown = _task(_attempt(1, types_pb2.PLANNER_TRANSPORT_UNSPECIFIED, host="h9"))
    history, note = group_history(unknown, [], {"h9": "direct"})
    assert history[0].planner_transport == "direct"
    assert note == DIRECT_TRANSPORT


def test_history_groups_by_attempt_newest_first_in_step_order() -> None:
    task = _task(
        _attempt(1, types_pb2.PLANNER_TRANSPORT_CLOUD, step=2),
        _attempt(2, types_pb2.PLANNER_TRANSPORT_CLOUD, step=1),
    )
    decisions = [_decision(1, 2), _decision(2, 1), _decision(1, 1)]
    history, note = group_history(task, decisions, {})
    assert note is None
    assert [h.attempt for h in history] == [2, 1]
    assert [d.step_index for d in history[1].decisions] == [1, 2]
    assert history[0].empty_reason is None


def test_badges_read_like_the_design() -> None:
    task = TaskOut.of(
        types_pb2.Task(
            attempt=2,
            max_attempts=3,
            status=types_pb2.TASK_STATUS_RUNNING,
            progress=types_pb2.Progress(
                step_index=4, step_status=types_pb2.STEP_STATUS_ACTING, summary="tap 'Display'"
            ),
        )
    )
    assert progress_badge(task) == "step 4 · acting · tap 'Display'"
    assert attempt_label(task) == "attempt 2 of 3"
    fresh = TaskOut.of(types_pb2.Task(max_attempts=3))
    assert progress_badge(fresh) == ""
    limited = types_pb2.Progress(
        step_index=3, step_status=types_pb2.STEP_STATUS_PLANNING, summary="s", max_steps=30
    )
    running = TaskOut.of(types_pb2.Task(status=types_pb2.TASK_STATUS_RUNNING, progress=limited))
    assert progress_badge(running) == "step 3 of at most 30 · planning · s"
    assert (
        formatting.progress_badge(limited, types_pb2.TASK_STATUS_RUNNING)
        == "step 3 of at most 30 · planning · s"
    )
    assert attempt_label(fresh) == "not assigned yet (3 allowed)"
    # Queued again after an attempt ended: no step, the cloud's words on why it waits.
    why = "re-queued after attempt 1 ended: lease expired"
    waits = TaskOut.of(
        types_pb2.Task(
            attempt=1,
            max_attempts=3,
            status=types_pb2.TASK_STATUS_QUEUED,
            progress=types_pb2.Progress(summary=why),
        )
    )
    assert progress_badge(waits) == why
    queued = types_pb2.TASK_STATUS_QUEUED
    assert formatting.progress_badge(types_pb2.Progress(summary=why), queued) == why


def test_the_progress_line_never_says_the_task_succeeded_when_it_failed() -> None:
    """The issue's "step 6 · succeeded · step 6: give up …" on a failed task: the step's own
    state reads as what the action did, the loop's "step N:" prefix is not repeated, and the
    task's status stays in its own pill."""
    gave_up = types_pb2.Progress(
        step_index=6,
        step_status=types_pb2.STEP_STATUS_SUCCEEDED,
        summary="step 6: give up: the setting is missing",
        max_steps=30,
    )
    failed = TaskOut.of(types_pb2.Task(status=types_pb2.TASK_STATUS_FAILED, progress=gave_up))
    line = "last step 6 · action done · give up: the setting is missing"
    assert progress_badge(failed) == line
    assert formatting.progress_badge(gave_up, types_pb2.TASK_STATUS_FAILED) == line
    assert "succeeded" not in line
    broken = types_pb2.Progress(
        step_index=2, step_status=types_pb2.STEP_STATUS_FAILED, summary="step 2: tap 'X'"
    )
    running = TaskOut.of(types_pb2.Task(status=types_pb2.TASK_STATUS_RUNNING, progress=broken))
    assert progress_badge(running) == "step 2 · action failed · tap 'X'"


def test_unknown_enum_numbers_and_bad_json_do_not_break_the_view() -> None:
    task = TaskOut.of(types_pb2.Task(status=types_pb2.TaskStatus.ValueType(99)))
    assert task.status == "unspecified"
    decision = DecisionOut.of(types_pb2.Decision(arguments_json="{not json"))
    assert decision.arguments is None
    assert decision.arguments_json == "{not json"
    stamped = TaskOut.of(types_pb2.Task(created_at=Timestamp(seconds=1_800_000_000)))
    assert stamped.created_at == datetime.fromtimestamp(1_800_000_000, UTC)
    assert stamped.finished_at is None


@pytest.mark.parametrize("made", [_console_password, _secrets_key_file])
def test_the_embedded_stacks_secrets_are_private_from_their_first_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: Callable[[Path], object]
) -> None:
    """The file is created 0600, not written under the umask and chmod-ed after: with chmod
    doing nothing, it still is readable by its owner only."""
    monkeypatch.setattr(Path, "chmod", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(os, "chmod", lambda *_args, **_kwargs: None)
    first = made(tmp_path / "stack")
    [written] = (tmp_path / "stack").iterdir()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert made(tmp_path / "stack") == first  # made once, then kept


@pytest.mark.parametrize(
    ("details", "shown"),
    [
        (
            "the cloud's database is unavailable; retry",
            "the cloud's database is unavailable; retry",
        ),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:50051: "
            "Failed to connect to remote host: Connection refused",
            UNREACHABLE,
        ),
        ("errors resolving cloud.internal:443: [field:hostname lookup error]", UNREACHABLE),
        ("connections to all backends failing; last error: [fd00::5]:443", UNREACHABLE),
        ("", UNREACHABLE),
    ],
)
def test_an_unreachable_cloud_is_described_without_its_address(details: str, shown: str) -> None:
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details
    )
    assert describe(error) == (503, shown, "UNAVAILABLE")


def test_the_spent_daily_budget_says_what_stops_and_what_does_not() -> None:
    """The fleet card said "planning is refused until tomorrow (UTC)" once the day's budget was
    spent, which a direct-transport host disproves: the task it is running plans on with its own
    model calls. What stops is new tasks, for every host, and the cloud's own planning."""
    spend = SpendOut.of(
        fleet_service_pb2.GetSpendResponse(
            today=types_pb2.Usage(input_tokens=1200, cost_usd=2.5),
            daily_budget=types_pb2.TaskBudget(max_cost_usd=2.0),
        )
    )
    html = PAGES.env.get_template("_cost.html").module.fleet_spend(spend)  # type: ignore[attr-defined]
    pill = re.search(r'data-field="budget-exhausted">([^<]*)<', str(html))
    assert pill is not None, html
    assert pill[1] == (
        "daily budget exhausted: no host gets a new task and the cloud plans no step until "
        "tomorrow (UTC); a task a direct-transport host is already running keeps planning with "
        "its own model calls"
    )


def test_a_step_whose_summary_is_its_status_says_it_once() -> None:
    """The agent loop's summary of a look is "step N: looking at the screen", the status's own
    words: every watch line, task list and page read "looking at the screen · looking at the
    screen"."""
    looking = types_pb2.Progress(
        step_index=2,
        step_status=types_pb2.STEP_STATUS_PERCEIVING,
        summary="step 2: looking at the screen",
        max_steps=30,
    )
    assert (
        formatting.progress_badge(looking, types_pb2.TASK_STATUS_RUNNING)
        == "step 2 of at most 30 · looking at the screen"
    )


def test_a_watch_shows_a_task_s_end_stamped_before_what_it_showed() -> None:
    """A task's end written by a replica whose clock is a little behind the one that wrote the
    state shown carries an older updated_at: `amc task watch` took it for a stale read and
    dropped it, then (its stream ended with the task) reconnected for good, the same end
    dropped at each snapshot. An end always follows what it ends."""
    shown = types_pb2.Task(task_id="t", status=types_pb2.TASK_STATUS_RUNNING)
    shown.updated_at.FromNanoseconds(2_000_000_000)
    ended = types_pb2.Task(task_id="t", status=types_pb2.TASK_STATUS_CANCELLED)
    ended.updated_at.FromNanoseconds(1_999_000_000)
    assert watching._age(ended, shown) > 0
    stale = types_pb2.Task(task_id="t", status=types_pb2.TASK_STATUS_QUEUED)
    stale.updated_at.FromNanoseconds(1_999_000_000)
    assert watching._age(stale, shown) < 0


def test_a_watch_remembers_every_unfinished_task_and_only_the_ends_shown_last() -> None:
    """A fleet watch remembered every task it ever showed: left running on a busy cloud it grew
    by every task the fleet ran. It keeps the unfinished ones (a catch-up looks for their ends)
    and the last ended ones (to know an end sent again), oldest ends forgotten first."""
    shown = watching.Shown(ended_kept=2)
    running = types_pb2.Task(task_id="live", status=types_pb2.TASK_STATUS_RUNNING)
    shown.put(running)
    for i in range(5):
        shown.put(types_pb2.Task(task_id=f"end{i}", status=types_pb2.TASK_STATUS_SUCCEEDED))
    assert len(shown) == 3
    assert shown.get("live") == running and shown.unfinished() == [running]
    assert [t for t in ("end0", "end1", "end2", "end3", "end4") if shown.get(t)] == [
        "end3",
        "end4",
    ]
    failed = types_pb2.Task(task_id="live", status=types_pb2.TASK_STATUS_FAILED)
    shown.put(failed)  # its end is the newest: the oldest end kept goes
    assert (len(shown), shown.get("live"), shown.get("end3")) == (2, failed, None)
    assert shown.unfinished() == []


def test_an_enum_number_a_newer_cloud_sends_reads_unknown_not_a_crash() -> None:
    """`Name` raises ValueError for a number this console's protos do not know (a newer cloud
    may send one): a task listing, a history or a host listing failed over one word. It now
    reads `unknown (99)`; known numbers read as before."""
    assert formatting.status_name(types_pb2.TASK_STATUS_RUNNING) == "running"
    assert formatting.status_name(99) == "unknown (99)"
    assert formatting.step_status_name(99) == "unknown (99)"
    assert formatting.enum_word(types_pb2.DeviceState, 99, "DEVICE_STATE_") == "unknown (99)"
    event = task_service_pb2.LeaseEvent(kind=99, result_status=99)  # type: ignore[arg-type]
    assert _event_word(event) == "unknown (99)"
    event = task_service_pb2.LeaseEvent(
        kind=task_service_pb2.LEASE_EVENT_KIND_RESULT,
        result_status=99,  # type: ignore[arg-type]
    )
    assert _event_word(event) == "result: unknown (99)"


def test_a_health_status_a_newer_cloud_sends_reads_unknown_not_a_crash() -> None:
    """The gateway named the cloud's health status with `ServingStatus.Name`, which raises
    ValueError for a number its protos do not know: /healthz and /readyz answered 500. It now
    reads `UNKNOWN (99)` (not "SERVING": /readyz says 503); known statuses read as before."""
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health_word(serving) == "SERVING"
    assert health_word(health_pb2.HealthCheckResponse.NOT_SERVING) == "NOT_SERVING"
    assert health_word(99) == "UNKNOWN (99)"


@pytest.mark.parametrize(
    ("text", "sensitive"),
    [("{{ secret:pin }}", True), ("•••", True), ("hello there", False)],
)
def test_the_overlay_words_a_typing_step_as_every_other_place(text: str, sensitive: bool) -> None:
    """The overlay's label said `type '{{ secret:pin }}'` (Python's repr) where the progress
    line, exports and the host console say `type {{secret:pin}}` (`describe.typed_text`)."""
    screen = ScreenOut(
        phase="before", url="/s", content_type="image/png", width=1080, height=2400, target=None
    )
    typed = types_pb2.Action(input_text=types_pb2.InputTextAction(text=text, sensitive=sensitive))
    decision = DecisionOut.of(types_pb2.Decision(decision_id="d1", task_id="t1", action=typed))
    marks = overlay(decision, screen)
    assert marks is not None and marks.label == describe_action(typed)
