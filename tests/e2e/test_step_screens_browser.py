"""The operators' step view in Chromium, on a real run: the embedded stack (cloud over mTLS,
a host on the direct transport driving a virtual phone over adb, the offline planner) runs a
task; the host ships its decisions and screenshots from its outbox; the real gateway serves the
task page, whose steps show the before and after screenshots fetched from the cloud's artifact
store, the action drawn over the before one, and the expected outcome beside what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Playwright, expect, sync_playwright
from pydantic import SecretStr
from rich.console import Console

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    fleet_service_pb2,
    task_service_pb2,
    types_pb2,
)
from console.embedded import HOST_ID, OPERATOR, EmbeddedStack, embedded_stack, follow_tasks
from console.gateway import create_app
from console.settings import ConsoleSettings
from tests.console.console_stack import UvicornThread
from tests.support.loop_thread import LoopThread
from tests.support.migrated import seeded

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "step-view-password-123"
WAIT_S = 60.0


@dataclass
class Run:
    """A finished task of a real run, everything it shipped in the cloud, and the console."""

    task_id: str
    decisions: list[types_pb2.Decision]
    screenshots: list[artifact_service_pb2.StepScreenshot]
    console: str


async def _shipped(stack: EmbeddedStack, task_id: str) -> Run:
    """Until the host's outbox is empty and every decision has both screenshots."""
    artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(stack.operator.channel)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        decisions = await stack.operator.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        shots = await artifacts.ListStepScreenshots(
            artifact_service_pb2.ListStepScreenshotsRequest(task_id=task_id)
        )
        hosts = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
        host = next(h for h in hosts.hosts if h.host_id == HOST_ID)
        complete = decisions.decisions and len(shots.screenshots) == 2 * len(decisions.decisions)
        if complete and host.HasField("outbox") and host.outbox.items == 0:
            return Run(task_id, list(decisions.decisions), list(shots.screenshots), "")
        assert loop.time() < deadline, f"not shipped: {decisions}, {shots}, {host.outbox}"
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _run(data_dir: Path) -> AsyncIterator[tuple[EmbeddedStack, Run]]:
    async with embedded_stack(seeded(data_dir), transport="direct") as stack:
        submitted = await stack.operator.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme")
        )
        task_id = submitted.task.task_id
        final = await follow_tasks(stack.operator, [task_id], Console(file=None), 30)
        assert final[task_id].status == types_pb2.TASK_STATUS_SUCCEEDED, final[task_id]
        yield stack, await _shipped(stack, task_id)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The run (in its own event loop thread) and a console gateway on it."""
    loop = LoopThread("embedded")
    context = _run(tmp_path_factory.mktemp("step-view"))
    stack, run = loop.run(context.__aenter__(), timeout=120)
    gateway = UvicornThread(
        create_app(
            ConsoleSettings(
                cloud_address=stack.cloud_address,
                certs_dir=stack.pki_dir,
                operator_name=OPERATOR,
                tls_server_name="localhost",
                admin_password=SecretStr(PASSWORD),
                session_secret=SecretStr("step-view-session-secret-0123456789"),
            )
        )
    )
    run.console = gateway.start()
    try:
        yield run
    finally:
        gateway.stop()
        loop.run(context.__aexit__(None, None, None), timeout=60)
        loop.stop()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    with sync_playwright() as p:
        yield p


def test_a_step_shows_both_screens_with_its_action_and_outcome(
    real_run: Run, playwright: Playwright, tmp_path: Path
) -> None:
    run = real_run
    # The decisions came from the host (direct transport) and each step has both screenshots.
    assert [d.planner_transport for d in run.decisions] == [
        types_pb2.PLANNER_TRANSPORT_DIRECT
    ] * len(run.decisions)
    assert [d.step_index for d in run.decisions] == list(range(1, len(run.decisions) + 1))
    first = run.decisions[0]
    assert first.tool_name == "tap"

    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    try:
        page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
        page.goto(run.console + f"/tasks/{run.task_id}")
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        expect(page).to_have_url(re.compile(re.escape(f"/tasks/{run.task_id}") + "$"))

        step = page.locator(f"#step-{first.decision_id}")
        step.locator("> summary").click()
        expect(step.locator("[data-field=shipped]")).to_be_visible()
        for phase in ("before", "after"):
            image = step.locator(f"figure[data-phase={phase}] img")
            expect(image).to_be_visible()
            # Loaded from the gateway (which fetched it from the cloud): real pixels, the
            # phone's size.
            page.wait_for_function(
                "img => img.complete && img.naturalWidth > 0", arg=image.element_handle()
            )
            width = image.evaluate("img => img.naturalWidth")
            assert width == run.screenshots[0].width == 1080
        # The tap is drawn on the before screen, on the element it named.
        tap = step.locator("figure[data-phase=before] svg [data-mark=tap]")
        expect(tap).to_have_count(1)
        target = next(
            s.marks.target
            for s in run.screenshots
            if s.step_index == 1 and s.phase == artifact_service_pb2.SCREENSHOT_PHASE_BEFORE
        )
        cx, cy = float(tap.get_attribute("cx") or 0), float(tap.get_attribute("cy") or 0)
        assert (cx, cy) == ((target.left + target.right) // 2, (target.top + target.bottom) // 2)
        expect(step.locator("figure[data-phase=after] svg")).to_have_count(0)
        # Expected beside what happened (and the place the verdict will go).
        compare = step.locator("[data-field=outcome-compare]")
        expect(compare).to_contain_text(first.expected_outcome)
        expect(compare.locator("[data-field=outcome]")).to_contain_text("ran")
        expect(compare.locator("[data-field=verdict]")).to_be_visible()
        page.screenshot(path=str(tmp_path / "step-view.png"), full_page=True)

        # The image route needs the login: a fresh browser context gets the login page.
        anonymous = browser.new_context().new_page()
        url = f"{run.console}/api/tasks/{run.task_id}/attempts/1/steps/1/screens/before"
        reply = anonymous.request.get(url)
        assert reply.status == 401
    finally:
        browser.close()
