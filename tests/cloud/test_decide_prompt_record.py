"""The decision log records the prompt the model was sent, including what stood in for a
screenshot the provider could not take.

A real cloud over mTLS plans with the real Anthropic SDK against the local fake Messages server,
with screenshots sent to the model (AMC_PLANNER_SEND_SCREENSHOT). A screenshot within Decide's
8 MiB that is over Anthropic's 5 MB of base64 and cannot be re-encoded (its bytes are no image)
is left out of the request, and the model is told so in its place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
)
from cloud.server import CloudServer
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import ScriptedHost, channel, submit, tasks_stub
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, anthropic_message, text, tool_use


@pytest.fixture
def anthropic_env() -> dict[str, str]:
    return {"AMC_PLANNER_SEND_SCREENSHOT": "true"}


async def test_the_logged_prompt_says_the_screenshot_was_left_out(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    cloud = anthropic_cloud
    model.script_anthropic(
        anthropic_message(
            text("The launcher: Settings is there."),
            tool_use(
                "launch_app",
                {
                    "package_name": "com.android.settings",
                    "purpose": "open Settings",
                    "expected_outcome": "Settings opens",
                },
            ),
        )
    )
    ops = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p"])
        task_id = (await submit(tasks_stub(ops))).task.task_id
        a = (await host.next("assignment")).assignment
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        unreadable = b"\x89PNG\r\n\x1a\n" + bytes(6 * 1024 * 1024)
        await planner.Decide(
            planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
                screenshot=unreadable,
            )
        )
        (sent,) = model.bodies("/v1/messages")
        note, prompt = sent["messages"][0]["content"]
        assert note["type"] == "text" and note["text"].startswith("[No screenshot this step")

        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        (decision,) = listed.decisions
        # What the model read, in its order: the note where the image would have been, then
        # the prompt.
        assert decision.user_prompt == f"{note['text']}\n\n{prompt['text']}"
    finally:
        await host.close()
        await ops.close()
        await host_ch.close()
