"""The kinds of outbox item and the RPC that delivers each: decisions of the direct transport
(`DecisionLogService.ShipDecisions`, several per call), the cost of failed decisions' answered
model calls (the same call's `failed_calls`), model calls of unknown cost (its
`unsettled_calls`) and step screenshots
(`ArtifactService.UploadStepScreenshot`, one per call). A new kind is one more class here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf.message import Message

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

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> dict[int, str]:
        """Deliver the items (in order) or raise grpc.aio.AioRpcError; return those the cloud
        took the call but refused for good, by their position in `items`, with the code and
        reason a call of it alone would get ("FAILED_PRECONDITION: …")."""
        ...


@dataclass(slots=True)
class Shipped:
    """Records that travel in one field of ShipDecisions, many per call, each counted or
    recorded by the cloud once per id: `message` bodies in the request's `field`."""

    name: str
    field: str
    message: type[Message]
    batch_items: int = 100
    batch_bytes: int = 1024 * 1024

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> dict[int, str]:
        """The cloud names the records it refused alone (`ShipDecisionsResponse.refused`)
        and took the others; a cloud from before that refused the whole call instead."""
        stub = decision_log_service_pb2_grpc.DecisionLogServiceStub(channel)
        request = decision_log_service_pb2.ShipDecisionsRequest()
        getattr(request, self.field).extend(self.message.FromString(i.body) for i in items)
        reply = await stub.ShipDecisions(request, timeout=CALL_TIMEOUT_S)
        return {
            r.index: f"{r.code or 'INVALID_ARGUMENT'}: {r.reason}"  # as a call of it alone
            for r in reply.refused
            if r.field == self.field and 0 <= r.index < len(items)
        }


#: Direct-transport decisions, shipped in order.
DECISIONS = Shipped(
    DECISION,
    "entries",
    decision_log_service_pb2.ShippedDecision,
    batch_items=50,
    batch_bytes=4 * 1024 * 1024,
)
#: What failed decisions' answered model calls cost (direct transport).
FAILED = Shipped(FAILED_CALLS, "failed_calls", decision_log_service_pb2.ShippedFailedCalls)
#: Model calls of unknown cost (direct transport, decision 0080).
UNSETTLED_CALLS = Shipped(
    UNSETTLED, "unsettled_calls", decision_log_service_pb2.ShippedUnsettledCall
)


class Screenshots:
    """Step screenshots: `UploadStepScreenshotRequest` bodies, one per call."""

    name = SCREENSHOT
    batch_items = 1
    batch_bytes = 0

    async def send(self, channel: Any, items: Sequence[OutboxItem]) -> dict[int, str]:
        stub = artifact_service_pb2_grpc.ArtifactServiceStub(channel)
        for item in items:
            request = artifact_service_pb2.UploadStepScreenshotRequest.FromString(item.body)
            await stub.UploadStepScreenshot(request, timeout=CALL_TIMEOUT_S)
        return {}


KINDS: dict[str, Kind] = {k.name: k for k in (DECISIONS, FAILED, UNSETTLED_CALLS, Screenshots())}
