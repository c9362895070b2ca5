"""A task whose decisions are large, each within its limits: its log still lists, page by page.

ListDecisions filled a page with up to `page_size` decisions (100 by default) whatever their
size. Ten decisions with 500 KiB prompts (the limit is 512 KiB) made a 5 MB page: more than a
gRPC client takes by default (4 MiB: the console's channel, Python's, Node's), so the console
could not show the task; forty made one over the server's own 16 MiB, which no client could
read. Proves: through a channel with gRPC's default limits, every page arrives, each under
4 MiB, and following the page tokens gives every decision once, in order.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.duration_pb2 import Duration

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud.store import sessions
from planner.conversation.items import UserObservation, dumps_item
from tests.abuse.conftest import AbuseCloud, assigned
from tests.cloud.cloud_harness import ScriptedHost, channel

PROMPT = "u" * (500 * 1024)
DECISIONS = 10
CLIENT_LIMIT = 4 * 1024 * 1024


async def test_large_decisions_list_in_pages_a_default_client_reads(
    abuse_cloud: AbuseCloud,
) -> None:
    address, pki_dir = abuse_cloud.address, abuse_cloud.pki_dir
    ops_channel = channel(address, pki_dir, "operator-ops")  # gRPC's default message limits
    ops: Any = task_service_pb2_grpc.TaskServiceStub(ops_channel)
    log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_channel)
    host = ScriptedHost(address, pki_dir, "shipper")
    try:
        await host.connect(["large-pages-1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        task = await ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                target=types_pb2.TaskTarget(host_id="shipper", device_serial="large-pages-1"),
                lease_duration=Duration(seconds=600),
            )
        )
        a = await assigned(host, task.task.task_id)
        action = types_pb2.Action(purpose="p", expected_outcome="e")
        action.tap.element_id = "e1"
        ship: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host._channel)
        for i in range(DECISIONS):
            await ship.ShipDecisions(
                decision_log_service_pb2.ShipDecisionsRequest(
                    entries=[
                        decision_log_service_pb2.ShippedDecision(
                            host_decision_id=f"large-{i}",
                            task_id=a.task_id,
                            attempt=a.attempt,
                            lease_id=a.lease_id,
                            decision=types_pb2.Decision(
                                tool_name="tap",
                                action=action,
                                provider="offline",
                                model="m",
                                user_prompt=PROMPT,
                            ),
                        )
                    ]
                ),
                timeout=10,
            )

        steps: list[int] = []
        token = ""
        for _ in range(DECISIONS + 1):
            page = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id, page_token=token),
                timeout=10,
            )
            assert page.ByteSize() < CLIENT_LIMIT
            assert page.decisions, "a page with a token holds at least one decision"
            steps += [d.step_index for d in page.decisions]
            token = page.next_page_token
            if not token:
                break
        assert steps == list(range(1, DECISIONS + 1))
        assert all(len(d.user_prompt) == len(PROMPT) for d in page.decisions)
    finally:
        await host.close()
        await ops_channel.close()


async def test_a_large_conversation_lists_in_pages_a_default_client_reads(
    abuse_cloud: AbuseCloud,
) -> None:
    """The same for a session-mode conversation (GetConversation): ten observations of 500 KiB
    each, as a long screen dump makes them, in pages under 4 MiB, every item once, in order."""
    address, pki_dir = abuse_cloud.address, abuse_cloud.pki_dir
    ops_channel = channel(address, pki_dir, "operator-ops")  # gRPC's default message limits
    ops: Any = task_service_pb2_grpc.TaskServiceStub(ops_channel)
    log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_channel)
    host = ScriptedHost(address, pki_dir, "planner")
    try:
        await host.connect(["large-pages-2"])
        task = await ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                target=types_pb2.TaskTarget(host_id="planner", device_serial="large-pages-2"),
                lease_duration=Duration(seconds=600),
            )
        )
        a = await assigned(host, task.task.task_id)
        assert abuse_cloud.server.server is not None
        store = abuse_cloud.server.server.store
        items = [
            ("observation", dumps_item(UserObservation(text=f"{i} " + PROMPT)))
            for i in range(DECISIONS)
        ]
        abuse_cloud.server.run(sessions.append(store, a.task_id, a.attempt, 0, items))

        texts: list[str] = []
        token = ""
        for _ in range(DECISIONS + 1):
            page = await log.GetConversation(
                decision_log_service_pb2.GetConversationRequest(
                    task_id=a.task_id, attempt=a.attempt, page_token=token
                ),
                timeout=10,
            )
            assert page.ByteSize() < CLIENT_LIMIT
            assert page.items, "a page with a token holds at least one item"
            texts += [item.text.split(" ", 1)[0] for item in page.items]
            token = page.next_page_token
            if not token:
                break
        assert texts == [str(i) for i in range(DECISIONS)]
    finally:
        await host.close()
        await ops_channel.close()
