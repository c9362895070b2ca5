"""What the console reads from a running host: its store, its lease client, its phones.

`host.runner.HostApp` fits; so does anything with the same three read-only attributes (a test
may pass a store alone, with `lease` and `registry` set to None). The console never writes.
"""

from __future__ import annotations

import logging
from typing import Protocol

from amc.v1 import types_pb2
from host.agent.loop import TaskSpec
from host.agent.progress import ProgressSnapshot
from host.console.present import PhoneNow, with_progress
from host.devices.registry import DeviceInfo, refused_serial
from host.timeline.store import TimelineStore

log = logging.getLogger(__name__)


class RunningTasks(Protocol):
    """The lease client's view of the assignments it is running (`LeaseClient.running`)."""

    def running(self) -> list[tuple[TaskSpec, ProgressSnapshot]]: ...


class Phones(Protocol):
    """The host's phones (`DeviceRegistry.devices`)."""

    def devices(self) -> list[DeviceInfo]: ...


class HostState(Protocol):
    """The parts of a host the console shows."""

    @property
    def store(self) -> TimelineStore: ...

    @property
    def lease(self) -> RunningTasks | None: ...

    @property
    def registry(self) -> Phones | None: ...


def _running(lease: RunningTasks | None) -> list[tuple[TaskSpec, ProgressSnapshot]]:
    """The running assignments; retried if the lease client changed them mid-read."""
    if lease is None:
        return []
    for _ in range(3):
        try:
            return list(lease.running())
        except RuntimeError:  # "dictionary changed size during iteration" (another thread)
            continue
    return []


def paused(state: HostState) -> str:
    """Why the host takes no work on any phone (its data folder cannot be written,
    `host.timeline.data_folder`); "" when it takes work or does not say."""
    folder = getattr(state.lease, "data_folder", None)
    why = getattr(folder, "unwritable", "")
    return why if isinstance(why, str) else ""


def phones_now(state: HostState) -> list[PhoneNow]:
    """Every known phone with its current task, plus running tasks on phones not (yet) listed.
    While the host is paused an online phone shows "paused": the cloud hears it offline. A
    phone whose id the cloud would refuse shows "refused", saying why: the cloud never hears
    of it."""
    phones: dict[str, PhoneNow] = {}
    registry = state.registry
    held = "paused" if paused(state) else ""
    for info in registry.devices() if registry is not None else []:
        name = types_pb2.DeviceState.Name(info.state).removeprefix("DEVICE_STATE_").lower()
        refused = refused_serial(info.serial)
        if refused:
            name = "refused"
        elif info.unhealthy:
            name = "unhealthy"
        elif name == "online":
            name = held or name
        phones[info.serial] = PhoneNow(
            serial=info.serial,
            model=info.model,
            state=name,
            unhealthy=info.unhealthy or info.adb_reason,
            refused=refused,
            adb_serial=info.adb_serial or (info.serial if info.shared else ""),
            serial_shared=info.shared,
        )
    for spec, snap in _running(state.lease):
        phone = phones.get(spec.device_serial) or PhoneNow(
            serial=spec.device_serial, model="", state="unknown"
        )
        phones[spec.device_serial] = with_progress(
            phone, spec.task_id, spec.attempt, spec.goal, snap
        )
    return sorted(phones.values(), key=lambda p: p.serial)


def cloud_link(state: HostState) -> tuple[bool | None, str]:
    """Whether the lease stream is up, and a short line about it (None: no lease client)."""
    lease = state.lease
    if lease is None:
        return None, "no cloud connection configured"
    connected = getattr(lease, "connected", None)
    host_id = getattr(lease, "host_id", None)
    if connected is True:
        return True, f"connected to the cloud as {host_id}" if host_id else "connected"
    error = getattr(lease, "last_error", None)
    return False, f"not connected to the cloud{f' ({error})' if error else ''}"


def host_id(state: HostState) -> str:
    """The host's id as its lease client or settings know it ("" when neither says)."""
    lease_id = getattr(state.lease, "host_id", None) if state.lease is not None else None
    settings = getattr(state, "settings", None)
    return str(lease_id or getattr(settings, "host_id", None) or "")


def planner_transport(state: HostState) -> str | None:
    """ "direct" or "cloud" when the host says (a `HostApp` has its settings), else None."""
    settings = getattr(state, "settings", None)
    transport = getattr(settings, "planner_transport", None)
    return transport if isinstance(transport, str) else None
