"""The host's durable outbox: records for the cloud, written in a step, sent in the background."""

from host.outbox.sender import OutboxSender
from host.outbox.shipments import Shipments, StepRef
from host.outbox.store import Backlog, OutboxItem, OutboxStore

__all__ = ["Backlog", "OutboxItem", "OutboxSender", "OutboxStore", "Shipments", "StepRef"]
