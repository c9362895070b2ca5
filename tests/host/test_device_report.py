"""Which phones a hello or device update carries when the host has more than the contract's
256 (`host.devices.registry.reported`)."""

from __future__ import annotations

from amc.v1 import types_pb2
from host.devices.registry import MAX_REPORTED, DeviceInfo, reported

ONLINE = types_pb2.DEVICE_STATE_ONLINE
OFFLINE = types_pb2.DEVICE_STATE_OFFLINE


def test_the_cut_keeps_the_phones_that_can_take_work() -> None:
    """Unhealthy phones (adb lists them online; the host keeps them out, reported OFFLINE)
    ranked with the usable ones: 256 sick phones whose serials sort first cut the healthy
    one out of the report, and the cloud never offered it work. They rank after every usable
    phone now, before the gone ones."""
    sick = [
        DeviceInfo(f"a{i:03}", "m", ONLINE, unhealthy="phone is unhealthy: …")
        for i in range(MAX_REPORTED)
    ]
    gone = DeviceInfo("b-gone", "m", OFFLINE)
    healthy = DeviceInfo("z-healthy", "m", ONLINE)
    listed = reported([*sick, gone, healthy])
    assert len(listed) == MAX_REPORTED
    assert listed[0] == healthy
    assert listed[1:] == sick[: MAX_REPORTED - 1]
    assert gone not in listed
    assert [d.serial for d in reported([gone, sick[0], healthy])] == [
        "z-healthy",
        "a000",
        "b-gone",
    ]
