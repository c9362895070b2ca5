"""An operator's gRPC connection to the cloud, shared by the CLI and the console gateway.

Operators authenticate with a client certificate whose SAN is `amc://operator/<name>`, exactly as
hosts do with theirs; there is no password path into the gRPC services.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from amc.v1 import (
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    flow_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2_grpc,
    types_pb2,
)


def secure_channel(
    address: str,
    *,
    ca: Path,
    cert: Path,
    key: Path,
    server_name: str | None = None,
    reconnect_initial_s: float = 0.5,
    reconnect_max_s: float = 5.0,
) -> grpc.aio.Channel:
    """An mTLS channel; `server_name` overrides the name checked against the server certificate.
    `reconnect_*` bound gRPC's backoff between connection attempts while the cloud is away."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes(),
        certificate_chain=cert.read_bytes(),
    )
    options: list[tuple[str, str | int]] = [
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # Reconnect as the host does (host/cloud_channel.py): gRPC's default backoff grows to
        # two minutes, so after a cloud restart the gateway kept answering 503 that long.
        ("grpc.initial_reconnect_backoff_ms", round(reconnect_initial_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", round(reconnect_max_s * 1000)),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, credentials, options=options)


def list_hosts_request(
    connection: fleet_service_pb2.HostConnection.ValueType, **fields: Any
) -> fleet_service_pb2.ListHostsRequest:
    """A ListHostsRequest for `connection`, with CONNECTED said in `connected_only` too: a
    cloud from before `connection` ignores it and listed every host for `--connected`; it
    reads `connected_only` (a newer cloud takes the two as one filter). DISCONNECTED has no
    older field: `hosts_kept` filters those answers here."""
    return fleet_service_pb2.ListHostsRequest(
        connection=connection,
        connected_only=connection == fleet_service_pb2.HOST_CONNECTION_CONNECTED,
        **fields,
    )


def hosts_kept(
    page: fleet_service_pb2.ListHostsResponse,
    connection: fleet_service_pb2.HostConnection.ValueType,
) -> fleet_service_pb2.ListHostsResponse:
    """`page` without the connected hosts when only DISCONNECTED ones were asked for: a cloud
    from before `connection` ignores it and answers every host (a newer one left them out
    already). Such a page may hold fewer hosts than asked for; its token goes on as usual."""
    if connection == fleet_service_pb2.HOST_CONNECTION_DISCONNECTED:
        down = [h for h in page.hosts if not h.connected]
        if len(down) < len(page.hosts):
            del page.hosts[:]
            page.hosts.extend(down)
    return page


async def watch_progress(
    stub: progress_service_pb2_grpc.ProgressServiceStub,
    task_id: str = "",
    *,
    thinking: bool = False,
    snapshot: bool = True,
    watching: Callable[[], object] | None = None,
    catch_up: Callable[[], Awaitable[list[types_pb2.Task]]] | None = None,
) -> AsyncGenerator[progress_service_pb2.WatchProgressResponse, None]:
    """Live task changes (snapshot first), one task per yielded message; with `thinking` also the
    model's live thinking. Ends when a watched single task ends; closing the iterator cancels the
    call. `watching` is called once the cloud watches (its headers came: every change from then
    on is streamed); not when the call failed first (the iterator then raises). The tasks
    `catch_up` then returns come first: what a caller reads itself once nothing can fall between
    its read and the stream (`console.watching`: what changed while the cloud was away).
    Without `snapshot` the cloud sends none, and a fleet's headers come without reading it.

    The call is `batched`: when many tasks change at once (a fleet's start, a snapshot of
    thousands) the replica writes several per message instead of one write each, which is what
    kept a fleet-wide watcher seconds behind (docs/benchmarks.md, twentieth pass). Callers still
    see one task per message, as without the flag.
    """
    call = stub.WatchProgress(
        progress_service_pb2.WatchProgressRequest(
            task_id=task_id, include_thinking=thinking, batched=True, skip_snapshot=not snapshot
        )
    )
    try:
        if watching is not None or catch_up is not None:
            await call.initial_metadata()
            if not call.done() or await call.code() == grpc.StatusCode.OK:
                if watching is not None:
                    watching()
                for task in await catch_up() if catch_up is not None else []:
                    yield progress_service_pb2.WatchProgressResponse(task=task)
        async for message in call:
            if not message.tasks:
                yield message
                continue
            for task in message.tasks:
                yield progress_service_pb2.WatchProgressResponse(
                    task=task, snapshot=message.snapshot
                )
    finally:
        call.cancel()


@dataclass(slots=True)
class OperatorClient:
    """Stubs of every operator-facing service over one channel."""

    channel: grpc.aio.Channel
    tasks: task_service_pb2_grpc.TaskServiceStub
    progress: progress_service_pb2_grpc.ProgressServiceStub
    fleet: fleet_service_pb2_grpc.FleetServiceStub
    decisions: decision_log_service_pb2_grpc.DecisionLogServiceStub
    flows: flow_service_pb2_grpc.FlowServiceStub

    @classmethod
    def over(cls, channel: grpc.aio.Channel) -> OperatorClient:
        return cls(
            channel=channel,
            tasks=task_service_pb2_grpc.TaskServiceStub(channel),
            progress=progress_service_pb2_grpc.ProgressServiceStub(channel),
            fleet=fleet_service_pb2_grpc.FleetServiceStub(channel),
            decisions=decision_log_service_pb2_grpc.DecisionLogServiceStub(channel),
            flows=flow_service_pb2_grpc.FlowServiceStub(channel),
        )

    async def close(self) -> None:
        await self.channel.close()
