"""An `input` or `monkey` the shell reports killed by a signal ("Killed": the low-memory
killer took its app_process; "Aborted": its runtime aborted): the Node example host reports
the step not executed, as the Python host does (`signal_death`, tests/host/test_phone_troubles.py).

Real parts: the cloud, host.js as its own process, the virtual phone over the adb protocol
(its `command_deaths` makes the shell print the signal's name, exit 128 + the signal), and for
the launch the Anthropic SDK's planner against a local model server.
"""

from __future__ import annotations

from pathlib import Path

from amc.v1 import decision_log_service_pb2, task_service_pb2
from host.devices.virtual.apps.notes import PKG as NOTES
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import cloud_and_phone
from tests.node.test_node_host import HOST_ID, _one_task, _run_node, node
from tests.support.fakes import ANTHROPIC_KEY, FakeModelServer, anthropic_message, tool_use

__all__ = ["node"]


async def test_a_tap_whose_input_was_killed_is_not_executed(node: str, tmp_path: Path) -> None:
    """The first tap's `input` is killed before it does anything: the shell prints only
    "Killed". host.js read no failure word in that and reported the tap executed ("tapped
    (x, y)"); it is now not executed, saying the command died and whether it took effect is
    unknown."""
    phone = VirtualPhone("emulator-5554")
    phone.command_deaths["input"] = ["Killed"]
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    first = decisions[0]
    assert first.tool_name == "tap", said
    assert not first.outcome.executed, first.outcome
    assert first.outcome.error.startswith(
        "tap on emulator-5554: the command died ('Killed') before it said it was done, "
        "so whether it took effect is unknown"
    ), first.outcome


async def test_a_launch_whose_monkey_aborted_is_not_executed(node: str, tmp_path: Path) -> None:
    """A launch whose `monkey` runtime aborts prints "Aborted" and starts no app: host.js
    reported the launch executed, with that word as its output. It is now not executed."""
    launch = {"package_name": NOTES, "purpose": "open notes", "expected_outcome": "notes open"}
    done = anthropic_message(tool_use("complete", {"success": False, "reason": "not open"}))
    phone = VirtualPhone("emulator-5554")
    phone.command_deaths["monkey"] = ["Aborted"]
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as provider:
        provider.script_anthropic(anthropic_message(tool_use("launch_app", launch)), done)
        planner = {
            "AMC_PLANNER_PROVIDER": "anthropic",
            "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
            "AMC_PLANNER_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            "AMC_PLANNER_ANTHROPIC_BASE_URL": provider.anthropic_base_url,
            "AMC_PLANNER_MAX_RETRIES": "0",
        }
        async with cloud_and_phone(tmp_path, phone, HOST_ID, planner) as rig:
            request = task_service_pb2.SubmitTaskRequest(goal="Open notes", max_attempts=1)
            task = (await rig.client.tasks.SubmitTask(request, timeout=10)).task
            said = await _run_node(node, rig)
            decisions = (
                await rig.client.decisions.ListDecisions(
                    decision_log_service_pb2.ListDecisionsRequest(task_id=task.task_id),
                    timeout=10,
                )
            ).decisions
    launched = decisions[0].outcome
    assert not launched.executed, (launched, said)
    assert launched.error.startswith(
        f"launch {NOTES} on emulator-5554: the command died ('Aborted') before it said it was done"
    ), (launched, said)
    assert phone.current_package() != NOTES
