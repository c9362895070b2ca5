"""Every Prometheus metric of a host agent, in one registry (`REGISTRY`, served at /metrics).

Labels have bounded values only (a phase, an outcome, a kind of device error, a phone state),
never a task id or a phone serial. Call sites are one line each at the narrowest seam: the agent
loop's phases (`host/agent/step_telemetry.py`), the OCR pool, the device driver's errors as the
loop, the action executor and perception meet them, the lease client, the cloud planner's
Decide call. Phones by state are read from the host's device registry and lease client at
scrape time (`PhoneStates`), so the gauge is never stale.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from host.devices.base import DeviceBusy, DeviceError, DeviceGone, ScreenLocked

REGISTRY = CollectorRegistry()

_PHASE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

steps = Counter(
    "amc_host_steps",
    "Agent loop steps finished, by outcome (succeeded: the action ran; failed: it did not)",
    ("outcome",),
    registry=REGISTRY,
)
step_seconds = Histogram(
    "amc_host_step_seconds", "Whole agent loop steps", buckets=_PHASE, registry=REGISTRY
)
phase_seconds = Histogram(
    "amc_host_step_phase_seconds",
    "Agent loop step phases: perceive (screen and dump, before and after), plan, act, record",
    ("phase",),
    buckets=_PHASE,
    registry=REGISTRY,
)
attempts = Counter(
    "amc_host_attempts",
    "Task attempts this host ended, by outcome (succeeded, failed, cancelled)",
    ("outcome",),
    registry=REGISTRY,
)
ocr_seconds = Histogram(
    "amc_host_ocr_seconds",
    "OCR of one screenshot",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
device_errors = Counter(
    "amc_host_device_errors",
    "Device errors seen, by kind (gone, busy, screen_locked, hierarchy, screenshot, other)",
    ("kind",),
    registry=REGISTRY,
)
renewals = Counter(
    "amc_host_lease_renewals",
    "Lease renewals sent and acked, and revocations received (a refused renewal is one)",
    ("outcome",),
    registry=REGISTRY,
)
reconnects = Counter(
    "amc_host_lease_reconnects",
    "Lease streams lost (and reconnected with backoff)",
    registry=REGISTRY,
)
decide_seconds = Histogram(
    "amc_host_decide_seconds",
    "Decide calls to the cloud planner as the host sees them, by outcome (ok or the gRPC status)",
    ("outcome",),
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
    registry=REGISTRY,
)
budget_refusals = Counter(
    "amc_host_budget_refusals",
    "Model calls the host did not make because the task's budget was spent (direct transport)",
    registry=REGISTRY,
)


def device_error_kind(error: BaseException) -> str:
    """The bounded name of a device error."""
    if isinstance(error, DeviceGone):
        return "gone"
    if isinstance(error, DeviceBusy):
        return "busy"
    if isinstance(error, ScreenLocked):
        return "screen_locked"
    name = type(error).__name__
    if name == "HierarchyError":
        return "hierarchy"
    if name == "ScreenshotError":
        return "screenshot"
    return "other"


def device_error(error: DeviceError) -> None:
    device_errors.labels(kind=device_error_kind(error)).inc()


class PhoneSource(Protocol):
    """A host whose phones are counted (`host.runner.HostApp`)."""

    def phone_states(self) -> Iterator[tuple[str, bool, bool]]:
        """(serial, online, busy) of each phone the host drives."""
        ...


class PhoneStates(Collector):
    """`amc_host_phones{state}`: online idle, busy, offline — read at scrape time from every
    host assembled in this process (one, outside tests), for as long as it lives."""

    def __init__(self) -> None:
        self._hosts: weakref.WeakSet[PhoneSource] = weakref.WeakSet()
        self._lock = threading.Lock()

    def watch(self, host: PhoneSource) -> None:
        """Count `host`'s phones for as long as it lives."""
        with self._lock:
            self._hosts.add(host)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = {"idle": 0, "busy": 0, "offline": 0}
        with self._lock:
            hosts = list(self._hosts)
        for host in hosts:
            for _serial, online, busy in host.phone_states():
                counts["offline" if not online else "busy" if busy else "idle"] += 1
        family = GaugeMetricFamily(
            "amc_host_phones",
            "Phones of this host by state (idle, busy, offline)",
            labels=["state"],
        )
        for state, n in counts.items():
            family.add_metric([state], n)
        yield family


phones = PhoneStates()
REGISTRY.register(phones)
