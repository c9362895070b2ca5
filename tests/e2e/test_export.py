"""Export end to end, as an operator runs it: a task on the embedded stack (real cloud over mTLS,
real host, virtual phone over the adb protocol, offline planner), then `amc host export`,
`amc task export` and `amc task export --merge` as new processes.

On either transport the cloud has every decision with its screen (the direct transport's shipped
from the host's outbox) and every step's screenshots (shipped from the outbox too); the host has
the screenshots and the screens; the merge has both.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    task_service_pb2,
    types_pb2,
)
from console.embedded import HOST_ID, Transport, embedded_stack, follow_tasks
from export import dataset
from export.bundle import read_bundle
from tests.support.migrated import seeded

AMC = str(Path(sys.executable).with_name("amc"))


async def amc(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        AMC,
        *args,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, output.decode()


async def shipped(operator: Any, task_id: str) -> None:
    """Until the host's outbox delivered every decision and both screenshots of each step."""
    artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(operator.channel)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        decisions = await operator.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        shots = await artifacts.ListStepScreenshots(
            artifact_service_pb2.ListStepScreenshotsRequest(task_id=task_id)
        )
        done = decisions.decisions and decisions.decisions[-1].tool_name == "complete"
        if done and len(shots.screenshots) == 2 * len(decisions.decisions):
            return
        assert loop.time() < deadline, (decisions, shots)
        await asyncio.sleep(0.05)


def step_lines(path: Path) -> list[dataset.StepRecordV1]:
    with zipfile.ZipFile(path) as z:
        return [dataset.parse_line(x) for x in z.read("steps.jsonl").decode().splitlines()]


@pytest.mark.parametrize("transport", ["cloud", "direct"])
async def test_host_cloud_and_merged_exports(tmp_path: Path, transport: Transport) -> None:
    data = tmp_path / "stack"
    host_env = {"AMC_HOST_DATA_DIR": str(data / "host"), "AMC_HOST_HOST_ID": HOST_ID}
    async with embedded_stack(seeded(data), transport=transport) as stack:
        submitted = await stack.operator.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme")
        )
        task_id = submitted.task.task_id
        final = await follow_tasks(stack.operator, [task_id], Console(file=None), 30)
        assert final[task_id].status == types_pb2.TASK_STATUS_SUCCEEDED
        await shipped(stack.operator, task_id)
        conn = ["--cloud", stack.cloud_address, "--pki-dir", str(stack.pki_dir)]

        # The commands that do not read each other's output run at once: each is a new
        # process whose start-up (seconds on a loaded machine) is most of its time.
        (tmp_path / "notes.txt").write_text("not an export")
        host_export, cloud_export, not_a_zip, no_task, not_here, no_timeline = await asyncio.gather(
            amc("host", "export", task_id, "-o", "host.zip", cwd=tmp_path, env=host_env),
            amc(*conn, "task", "export", task_id, "-o", "cloud.zip", cwd=tmp_path),
            # Refusals: one line, exit 2, nothing written.
            amc(
                *conn,
                "task",
                "export",
                task_id,
                "--merge",
                "notes.txt",
                "-o",
                "x.zip",
                cwd=tmp_path,
            ),
            amc(*conn, "task", "export", "no-such-task", cwd=tmp_path),
            amc("host", "export", "no-such-task", cwd=tmp_path, env=host_env),
            amc(
                "host",
                "export",
                task_id,
                cwd=tmp_path,
                env={"AMC_HOST_DATA_DIR": str(tmp_path / "nowhere")},
            ),
        )
        code, said = host_export
        assert code == 0, said
        assert "host.zip" in said and "host" in said
        code, said = cloud_export
        assert code == 0, said
        code, said = not_a_zip
        assert code == 2
        assert "export" in said and "not a zip file" in said
        assert not (tmp_path / "x.zip").exists()
        code, said = no_task
        assert code == 2 and "is not a task id" in said
        code, said = not_here
        assert code == 2 and "not in this host's timeline" in said
        code, said = no_timeline
        assert code == 2 and "no host timeline" in said
        code, said = await amc(
            *conn, "task", "export", task_id, "--merge", "host.zip", cwd=tmp_path
        )
        assert code == 0, said
        merged_path = tmp_path / f"amc-export-{task_id}.zip"
        assert merged_path.is_file()

    host = read_bundle(tmp_path / "host.zip")
    cloud = read_bundle(tmp_path / "cloud.zip")
    merged = read_bundle(merged_path)
    assert host.origin == "host" and cloud.origin == "cloud" and merged.origin == "cloud+host"
    assert host.steps and all(s.before_png and s.screen for s in host.steps)
    assert all(s.transport == transport for s in host.steps)
    # The cloud's export has the screenshots the host shipped to its artifact store.
    assert all(s.before_png and s.after_png for s in cloud.steps)
    assert [s.before_png for s in cloud.steps] == [s.before_png for s in host.steps]
    assert [s.key for s in cloud.steps] == [s.key for s in host.steps]
    assert [s.tool_name for s in cloud.steps] == [s.tool_name for s in host.steps]
    # The cloud keeps each decision's screen: its export places every tap without the host.
    for c, h in zip(cloud.steps, host.steps, strict=True):
        assert c.screen is not None and h.screen is not None
        assert [e.element_id for e in c.screen.elements] == [
            e.element_id for e in h.screen.elements
        ]
    clicks = [x for x in step_lines(tmp_path / "cloud.zip") if x.action.action_type == "click"]
    assert clicks and all(x.action.x is not None and x.ui_elements for x in clicks)
    # The merge: the cloud's decisions (or the host's steps), every screenshot and screen.
    assert [s.key for s in merged.steps] == [s.key for s in host.steps]
    assert all(s.before_png and s.screen for s in merged.steps)
    for line in step_lines(merged_path):
        assert line.screenshot is not None
        if line.action.action_type == "click":
            assert line.action.x is not None and line.action.element_bounds is not None
    with zipfile.ZipFile(merged_path) as z:
        notes = dataset.RunRecord.model_validate_json(z.read("run.json")).notes
    assert not any("no screenshot" in n for n in notes)
    with zipfile.ZipFile(tmp_path / "cloud.zip") as z:
        cloud_notes = dataset.RunRecord.model_validate_json(z.read("run.json")).notes
    assert not any("direct transport" in n for n in cloud_notes)
    # What we asked the model, in every report: each step's user prompt, the system prompt
    # once for the attempt (the cloud has the prompts of both transports' decisions).
    for name in ("host.zip", "cloud.zip", merged_path.name):
        with zipfile.ZipFile(tmp_path / name) as z:
            html = z.read("report.html").decode()
        assert html.count('data-field="user-prompt"') == len(host.steps), name
        assert html.count('data-field="system-prompt"') == 1, name


async def test_an_export_holds_every_decision_past_the_console_s_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's views read at most `MAX_DECISIONS` decisions of a task; an export read
    the same and silently left out every step past it (5,000 in production: a task of 20
    attempts of 250 steps). The cap and the page sizes are made small here (module constants,
    the only change: real cloud, real host, real gRPC) so a four-step task crosses them."""
    from console.exporting import cloud_run
    from console.gateway import cloud as gateway_cloud

    data = tmp_path / "stack"
    async with embedded_stack(seeded(data), transport="cloud") as stack:
        submitted = await stack.operator.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme")
        )
        task_id = submitted.task.task_id
        final = await follow_tasks(stack.operator, [task_id], Console(file=None), 30)
        assert final[task_id].status == types_pb2.TASK_STATUS_SUCCEEDED
        await shipped(stack.operator, task_id)
        logged = await stack.operator.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        steps = len(logged.decisions)
        assert steps >= 3, logged
        monkeypatch.setattr(gateway_cloud, "MAX_DECISIONS", 2)
        monkeypatch.setattr(gateway_cloud, "DECISION_PAGE", 1)
        monkeypatch.setattr(gateway_cloud, "OBSERVATION_PAGE", 1)
        client = gateway_cloud.CloudClient(
            stack.cloud_address,
            ca=stack.pki_dir / "ca.pem",
            cert=stack.pki_dir / "operator-admin.pem",
            key=stack.pki_dir / "operator-admin.key",
        )
        try:
            shown, _, _ = await client.decision_log(task_id, limit=gateway_cloud.MAX_DECISIONS)
            run = await cloud_run(client, task_id, client)
        finally:
            await client.close()
    assert len(shown) == 2  # the console's view stops at its cap
    assert [s.step_index for s in run.steps] == [d.step_index for d in logged.decisions]
