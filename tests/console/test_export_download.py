"""The operators' console's "Download": the cloud's export of a task over HTTP (the page link
with a session, the API with the bearer token), refused without either, 404 for an unknown
task, and made although a stored screenshot cannot be read. The cloud is real; a simulated
cloud-transport host makes the decisions it logs."""

from __future__ import annotations

import io
import re
import uuid
import zipfile
from html import unescape

import httpx

from amc.v1 import types_pb2
from cloud.artifacts import object_key
from cloud.store import screenshots
from cloud.store.models import StepScreenshotRow
from export import dataset
from export.bundle import read_bundle
from tests.console.console_stack import Cloud, HostFactory
from tests.console.test_pages import log_in
from tests.support.screenshots import cut_jpeg


def _finished_task(api: httpx.Client, make_host: HostFactory) -> tuple[str, str, int]:
    """A task a cloud-transport host planned twice and finished; (task id, goal, steps)."""
    host = make_host(types_pb2.PLANNER_TRANSPORT_CLOUD)
    goal = f"Open Display settings {uuid.uuid4().hex[:8]}"
    task = api.post("/api/tasks", json={"goal": goal, "host_id": host.host_id}).json()["task"]
    assignment = host.assignment()
    host.decide(assignment, goal)
    host.decide(assignment, goal)
    host.finish(assignment, types_pb2.TASK_STATUS_SUCCEEDED, "display settings open")
    return task["task_id"], goal, 2


def test_the_task_page_links_its_export_and_it_downloads(
    anon: httpx.Client, api: httpx.Client, make_host: HostFactory
) -> None:
    task_id, goal, steps = _finished_task(api, make_host)
    log_in(anon)
    page = anon.get(f"/tasks/{task_id}")
    assert page.status_code == 200
    link = re.search(r'<a class="button" href="([^"]+)" download data-field="export"', page.text)
    assert link is not None
    assert link.group(1) == f"/tasks/{task_id}/export"
    # What the link says the zip holds: hosts ship their screenshots to the cloud.
    title = re.search(r'data-field="export" title="([^"]+)"', page.text)
    assert title is not None and "screenshots the hosts shipped" in unescape(title.group(1))

    response = anon.get(link.group(1))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/zip"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="amc-export-{task_id}.zip"'
    )
    run = read_bundle(response.content)
    assert run.task_id == task_id
    assert run.goal == goal
    assert run.status == "succeeded"
    assert run.result == "display settings open"
    assert run.origin == "cloud"
    assert [s.step_index for s in run.steps] == list(range(1, steps + 1))
    assert all(s.before_png is None and s.transport == "cloud" for s in run.steps)
    with zipfile.ZipFile(io.BytesIO(response.content)) as z:
        notes = dataset.RunRecord.model_validate_json(z.read("run.json")).notes
        assert any("2 of 2 steps have no screenshot" in n and "--merge" in n for n in notes)
        for line in z.read("steps.jsonl").decode().splitlines():
            record = dataset.parse_line(line)
            assert record.screenshot is None
            assert record.model.provider == "offline"
        assert goal in z.read("report.html").decode()
        assert z.read("run.mp4")


def test_the_api_exports_with_the_bearer_token(api: httpx.Client, make_host: HostFactory) -> None:
    task_id, _, steps = _finished_task(api, make_host)
    response = api.get(f"/api/tasks/{task_id}/export")
    assert response.status_code == 200
    assert len(read_bundle(response.content).steps) == steps


def test_no_export_without_credentials_or_for_an_unknown_task(
    anon: httpx.Client, api: httpx.Client
) -> None:
    page = anon.get("/tasks/whatever/export")
    assert page.status_code == 303
    assert page.headers["location"].startswith("/login")
    assert anon.get("/api/tasks/whatever/export").status_code == 401
    missing = api.get("/api/tasks/no-such-task/export")
    assert missing.status_code == 404
    assert "no-such-task" in missing.json()["detail"]
    log_in(anon)
    assert anon.get("/tasks/no-such-task/export").status_code == 404


def test_the_clouds_export_writes_step_4_with_the_prompts_and_the_models_verdict(
    api: httpx.Client, make_host: HostFactory
) -> None:
    """The cloud's export (through the real gateway, from the real decision log) writes
    amc.export.step/4: each step's user prompt, the system prompt once for the attempt, and
    the model's own verdict on its previous step, as the decision log keeps them."""
    task_id, _, steps = _finished_task(api, make_host)
    response = api.get(f"/api/tasks/{task_id}/export")
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as z:
        records = [dataset.parse_line(x) for x in z.read("steps.jsonl").decode().splitlines()]
    assert len(records) == steps
    first, second = records
    assert isinstance(first, dataset.StepRecord) and isinstance(second, dataset.StepRecord)
    assert first.schema_version == "amc.export.step/4"
    assert first.resumed_from is None and second.resumed_from is None  # both asked the model
    assert first.user_prompt and second.user_prompt
    assert first.system_prompt and second.system_prompt is None  # once for the attempt
    for judged in (first.previous_step, second.previous_step):  # the offline planner judges
        assert judged is not None and judged.note  # every step ("first step: nothing to judge")
        assert judged.verdict in ("met", "not met", "unknown")
    assert first.flow is None and second.flow is None


def test_a_stored_screenshot_the_export_cannot_read_is_left_out_and_the_download_is_made(
    api: httpx.Client, make_host: HostFactory, cloud: Cloud
) -> None:
    """A JPEG cut in half, stored before the cloud decoded uploads (put straight into its
    artifact store and screenshot table here: the upload refuses it now), made every Download
    of its task answer 500: the task could never be exported. The step shows a plain frame,
    and the export says which screenshot it left out and why."""
    host = make_host(types_pb2.PLANNER_TRANSPORT_CLOUD)
    goal = f"Open Display settings {uuid.uuid4().hex[:8]}"
    task_id = api.post("/api/tasks", json={"goal": goal, "host_id": host.host_id}).json()["task"][
        "task_id"
    ]
    assignment = host.assignment()
    decision = host.decide(assignment, goal)
    host.finish(assignment, types_pb2.TASK_STATUS_SUCCEEDED, "display settings open")
    data = cut_jpeg()
    key = object_key(task_id, 1, decision.step_index, "before", "image/jpeg")
    server = cloud.server
    cloud.loop.run(server.artifacts.put(key, data, "image/jpeg"))
    row = StepScreenshotRow(
        task_id=task_id,
        attempt=1,
        step_index=decision.step_index,
        phase="before",
        decision_id=decision.decision_id,
        host_id=host.host_id,
        object_key=key,
        content_type="image/jpeg",
        size_bytes=len(data),
        width=108,
        height=240,
        uploaded_at=server.store.now(),
    )
    cloud.loop.run(screenshots.record(server.store, row))

    response = api.get(f"/api/tasks/{task_id}/export")
    assert response.status_code == 200, response.text
    run = read_bundle(response.content)
    assert [s.before_png for s in run.steps] == [None]
    unread = [n for n in run.notes if "could not be read" in n]
    assert len(unread) == 1 and unread[0].startswith(
        f"attempt 1 step {decision.step_index}: the before screenshot could not be read ("
    ), run.notes
