"""What the cloud says of its hosts and of some tasks, as text for a failed test's message.

A task that never ends tells nothing by its status alone: QUEUED for two minutes may be a host
that is gone (its stream closed, its process dead), a phone it reports OFFLINE, a phone the
cloud still counts busy with an earlier attempt, a hold on new work, or a dispatch that never
ran. The host rows (connected, each phone's state and reason, busy phones, hold, stop) and the
tasks' lease events (assigned, refused, revoked) tell those apart.
"""

from __future__ import annotations

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message

from amc.v1 import fleet_service_pb2, task_service_pb2
from console.client import OperatorClient


def _line(message: Message) -> str:
    return text_format.MessageToString(message, as_one_line=True)


#: Each call's deadline: a cloud too loaded to answer in it is said so, not waited for.
_CALL_S = 10.0


async def cloud_view(client: OperatorClient, task_ids: list[str]) -> str:
    """Every host row and each task with its lease events, as the cloud answers them now. A
    call that fails is named in the text instead: this is read after something already went
    wrong, and must not hide that failure behind its own."""
    parts: list[str] = []
    try:
        hosts = await client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest(), timeout=_CALL_S)
        parts += [f"host: {_line(host)}" for host in hosts.hosts] or ["no host rows"]
    except grpc.aio.AioRpcError as exc:
        parts.append(f"ListHosts failed: {exc.code().name} {exc.details()}")
    for task_id in task_ids:
        try:
            task = await client.tasks.GetTask(
                task_service_pb2.GetTaskRequest(task_id=task_id), timeout=_CALL_S
            )
            events = await client.tasks.ListTaskEvents(
                task_service_pb2.ListTaskEventsRequest(task_id=task_id), timeout=_CALL_S
            )
        except grpc.aio.AioRpcError as exc:
            parts.append(f"task {task_id}: failed to read: {exc.code().name} {exc.details()}")
            continue
        parts.append(f"task: {_line(task.task)}")
        parts += [f"  event: {_line(event)}" for event in events.events] or ["  no lease events"]
    return "\n".join(parts)
