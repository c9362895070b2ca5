"""A phone with the serial of the one an attempt drives is plugged in midway (cheap phones ship
with one serial). adb then refuses the serial ("more than one device"), so the attempt's
driver, which addressed its phone by serial, can reach neither: the step must say why, and
touch neither phone. Real adbutils and uiautomator2 against the virtual adb server.
"""

from __future__ import annotations

import pytest

from host.devices.base import DeviceGone
from host.devices.registry import DeviceRegistry
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.runner import driver_factory
from host.settings import HostSettings

SERIAL = "0123456789ABCDEF"


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_twin_plugged_in_midway_is_named_not_taken_for_a_disconnect(driver: str) -> None:
    """Before, the step failed "phone … disconnected (tap: adb lists it as 'not listed: more
    than one device')", sending the operator to a cable that was fine. Now it names the
    shared serial; after the next poll a new attempt reaches its phone by transport id."""
    mine, twin = VirtualPhone(SERIAL), VirtualPhone(SERIAL)
    with ThreadedAdbServer([mine]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        make = driver_factory(HostSettings(adb_port=server.port, driver=driver), registry)
        drivers = [make(SERIAL)]
        try:
            drivers[0].tap(5, 5)
            server.server.add_phone(twin, share_serial=True)
            with pytest.raises(DeviceGone) as raised:
                drivers[0].tap(6, 6)
            said = str(raised.value)
            assert "disconnected" not in said, said
            assert "same serial" in said, said
            registry.mark_offline(SERIAL, raised.value.state)  # as the runner does
            registry.refresh()
            drivers.append(make(SERIAL))
            drivers[1].tap(7, 7)
            assert (mine.taps, twin.taps) == ([(5, 5), (7, 7)], [])
        finally:
            for each in drivers:
                if isinstance(each, U2Driver):
                    each._reset()
