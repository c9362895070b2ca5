"""The kinds of outbox item and the RPC that delivers each: decisions of the direct transport
(`DecisionLogService.ShipDecisions`, several per call), the cost of failed decisions' answered
model calls (the same call's `failed_calls`), model calls of unknown cost (its
`unsettled_calls`) and step screenshots
(`ArtifactService.UploadStepScreenshot`, one per call). A new kind is one more class here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
)

if TYPE_CHECKING:  # the store names the kinds it deletes (`UNSETTLED`)
    from host.outbox.store import OutboxItem

DECISION = "decision"
FAILED_CALLS = "failed_calls"
SCREENSHOT = "screenshot"
UNSETTLED = "unsettled_call"
CALL_TIMEOUT_S = 30.0


class Kind(Protocol):
    """How items of one kind reach the cloud."""

    name: str
    #: Most items per call, and most bytes per call (a single bigger item still goes alone).
    batch_items: int
    batch_bytes: int

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> None:
        """Deliver the items (in order) or raise grpc.aio.AioRpcError."""
        ...


class Decisions:
    """Direct-transport decisions: `ShippedDecision` bodies, shipped in order, many per call."""

    name = DECISION
    batch_items = 50
    batch_bytes = 4 * 1024 * 1024

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> None:
        stub = decision_log_service_pb2_grpc.DecisionLogServiceStub(channel)
        request = decision_log_service_pb2.ShipDecisionsRequest(
            entries=[decision_log_service_pb2.ShippedDecision.FromString(i.body) for i in items]
        )
        await stub.ShipDecisions(request, timeout=CALL_TIMEOUT_S)


class FailedCalls:
    """What failed decisions' answered model calls cost (direct transport): `ShippedFailedCalls`
    bodies, many per ShipDecisions call, counted by the cloud once per id."""

    name = FAILED_CALLS
    batch_items = 100
    batch_bytes = 1024 * 1024

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> None:
        stub = decision_log_service_pb2_grpc.DecisionLogServiceStub(channel)
        request = decision_log_service_pb2.ShipDecisionsRequest(
            failed_calls=[
                decision_log_service_pb2.ShippedFailedCalls.FromString(i.body) for i in items
            ]
        )
        await stub.ShipDecisions(request, timeout=CALL_TIMEOUT_S)


class UnsettledCalls:
    """Model calls of unknown cost (direct transport, decision 0080): `ShippedUnsettledCall`
    bodies, many per ShipDecisions call, recorded by the cloud once per id."""

    name = UNSETTLED
    batch_items = 100
    batch_bytes = 1024 * 1024

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> None:
        stub = decision_log_service_pb2_grpc.DecisionLogServiceStub(channel)
        request = decision_log_service_pb2.ShipDecisionsRequest(
            unsettled_calls=[
                decision_log_service_pb2.ShippedUnsettledCall.FromString(i.body) for i in items
            ]
        )
        await stub.ShipDecisions(request, timeout=CALL_TIMEOUT_S)


class Screenshots:
    """Step screenshots: `UploadStepScreenshotRequest` bodies, one per call."""

    name = SCREENSHOT
    batch_items = 1
    batch_bytes = 0

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> None:
        stub = artifact_service_pb2_grpc.ArtifactServiceStub(channel)
        for item in items:
            request = artifact_service_pb2.UploadStepScreenshotRequest.FromString(item.body)
            await stub.UploadStepScreenshot(request, timeout=CALL_TIMEOUT_S)


KINDS: dict[str, Kind] = {
    k.name: k for k in (Decisions(), FailedCalls(), UnsettledCalls(), Screenshots())
}
