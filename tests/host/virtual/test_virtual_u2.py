"""The real uiautomator2 library drives the virtual phone through its emulated on-device agent."""

from __future__ import annotations

import adbutils
import uiautomator2 as u2

from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.u2_agent import DEFAULT_PORT


def test_uiautomator2_drives_the_phone(device: adbutils.AdbDevice, phone: VirtualPhone) -> None:
    d = u2.connect(device)  # pushes u2.jar, starts the agent with app_process, pings it
    try:
        assert DEFAULT_PORT in phone.tcp_services
        assert d.info["displayWidth"] == 1080
        assert d.window_size() == (1080, 2400)
        assert d.dump_hierarchy().startswith("<?xml version='1.0'")
        assert d.screenshot().size == (1080, 2400)
        d.app_start("com.android.contacts")
        assert d.app_current()["package"] == "com.android.contacts"
        d(description="Create contact").click()
        d.send_keys("Ada Lovelace")  # installs the AdbKeyboard IME, types via its broadcast
        d(text="Phone").set_text("555 0100")
        d(text="Save").click()
        assert [(c.name, c.phone) for c in phone.state.contacts] == [("Ada Lovelace", "555 0100")]
        assert not d(text="Bob").exists
        d.press("back")
        d.press("home")
        assert d.app_current()["package"] == "com.android.launcher3"
        d.app_start("com.android.settings")
        assert not d(text="Location").exists
        d.swipe(540, 1800, 540, 600, 0.2)
        assert d(text="Location").exists
        d(text="Location").click()
        d(text="Use location").click()
        assert phone.state.settings["location"] is False
    finally:
        d.stop_uiautomator()
    assert DEFAULT_PORT not in phone.tcp_services  # closing the shell stopped the agent
