"""One task end to end through every real part: cloud gRPC server (mTLS, SQLite file), host agent
with its lease stream, the virtual phone over the adb protocol (real adbutils client), and the
offline planner — in-process for `direct`, behind PlannerService.Decide for `cloud`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from amc.v1 import decision_log_service_pb2, task_service_pb2, types_pb2
from console import exit_codes
from console.embedded import Transport, embedded_stack, follow_tasks
from telemetry.metrics_http import MetricsAddressError
from tests.support import leaks
from tests.support.migrated import seeded


async def _run_one(stack_dir: Path, transport: Transport, goal: str) -> types_pb2.Task:
    async with embedded_stack(seeded(stack_dir), transport=transport) as stack:
        submitted = await stack.operator.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal=goal)
        )
        task_id = submitted.task.task_id
        await follow_tasks(stack.operator, [task_id], Console(), 30)
        reply: task_service_pb2.GetTaskResponse = await stack.operator.tasks.GetTask(
            task_service_pb2.GetTaskRequest(task_id=task_id)
        )
        task = reply.task
        # On the direct transport the host ships its decisions from its outbox, in the
        # background: they arrive (all of them, once) shortly after the task ended.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:
            decisions = await stack.operator.decisions.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
            )
            if decisions.decisions and decisions.decisions[-1].tool_name == "complete":
                break
            assert loop.time() < deadline, decisions
            await asyncio.sleep(0.05)
        steps = [d.step_index for d in decisions.decisions]
        assert steps == list(range(1, len(steps) + 1))
        assert steps[-1] == task.progress.step_index
        assert all(d.purpose for d in decisions.decisions[:-1])
        assert all(d.rationale for d in decisions.decisions)
        expected = {"cloud": types_pb2.PLANNER_TRANSPORT_CLOUD}.get(
            transport, types_pb2.PLANNER_TRANSPORT_DIRECT
        )
        assert {d.planner_transport for d in decisions.decisions} == {expected}
        return task


@pytest.mark.parametrize("transport", ["cloud", "direct"])
async def test_dark_theme_task_succeeds_with_final_progress(
    tmp_path: Path, transport: Transport
) -> None:
    task = await _run_one(tmp_path, transport, "Turn on dark theme")
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.result_summary
    assert task.attempt == 1
    assert task.progress.step_index >= 3
    assert task.progress.summary
    assert [a.status for a in task.attempts] == [types_pb2.TASK_STATUS_SUCCEEDED]


def test_amc_demo_command_exits_zero_and_logs_through_the_handler_every_command_uses(
    tmp_path: Path,
) -> None:
    """The quickstart's main job, as a user runs it (a new process, the installed script).

        And its log: `amc demo` set its logging up with `logging.basicConfig`, not the handler
        every other command writes through: AMC_LOG_FORMAT and AMC_LOG_LEVEL did nothing, and its
        lines were not scrubbed of the configured secrets. Now each line is that handler's (JSON
        here). One run checks both (two runs of the whole demo were two tests' worth of time). And
    the folder it makes is owner-only (0700)."""
    amc = Path(sys.executable).with_name("amc")
    result = subprocess.run(
        [str(amc), "demo", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "200", "AMC_LOG_FORMAT": "json", "AMC_LOG_LEVEL": "INFO"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Turn on dark theme: succeeded" in result.stdout
    assert "purpose:" in result.stdout
    assert (tmp_path / "demo" / "pki" / "ca.pem").exists()
    # The stack's folder (its cloud's database and screenshots, the CA key) is the user's own.
    assert stat.S_IMODE((tmp_path / "demo").stat().st_mode) == 0o700
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "no log line at AMC_LOG_LEVEL=INFO"
    records = [json.loads(line) for line in lines]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert "INFO" in {r["level"] for r in records}


def test_ctrl_c_while_the_demo_runs_its_tasks_exits_130(tmp_path: Path) -> None:
    """The embedded host takes Ctrl-C itself (it hands its work back gracefully), so the demo's
    wait for its tasks' ends never heard it: the tasks went back to the queue, no host was
    left to take them, and `amc demo` waited forever. Now it stops with the host: exit 130."""
    amc = Path(sys.executable).with_name("amc")
    with subprocess.Popen(
        [str(amc), "demo", "--data-dir", str(tmp_path / "demo"), "--phones", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        # Python's own Ctrl-C handling, as in a terminal (a test run in the background
        # ignores SIGINT, and Python then keeps it ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as process:
        assert process.stdout is not None
        try:
            seen: list[str] = []
            while not any(" running attempt " in line for line in seen):
                line = process.stdout.readline()
                assert line, "".join(seen)
                seen.append(line)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=120)
        finally:
            process.kill()
    assert process.returncode == exit_codes.INTERRUPTED, "".join(seen) + out + err
    assert "amc demo: interrupted: the host handed its tasks back" in err
    assert "Traceback" not in err


async def test_a_stack_whose_host_metrics_port_is_taken_stops_what_it_started(
    tmp_path: Path,
) -> None:
    """The host's metrics address is held by another socket (`amc up --metrics` with 9465
    taken): the stack refuses, and the cloud, the host and the phones it had started are
    stopped, not left running behind the error."""
    before = leaks.running()
    with socket.create_server(("127.0.0.1", 0)) as held:
        taken = f"127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(MetricsAddressError):
            async with embedded_stack(seeded(tmp_path / "stack"), metrics=("127.0.0.1:0", taken)):
                raise AssertionError("the stack started")
    assert [leaks.describe(s) for s in leaks.running() if s not in before] == []
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name() == "host"] == []
