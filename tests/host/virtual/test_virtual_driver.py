"""VirtualDriver: the Driver protocol over a VirtualPhone in the same process."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

import pytest
from PIL import Image

from host.devices.base import DeviceBusy, DeviceError, DeviceGone, Driver
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone


def _center(driver: VirtualDriver, text: str) -> tuple[int, int]:
    for node in ET.fromstring(driver.dump_hierarchy()).iter("node"):
        if text in (node.get("text"), node.get("content-desc")):
            bounds = node.get("bounds", "")
            x1, y1, x2, y2 = (int(v) for v in bounds.replace("][", ",").strip("[]").split(","))
            return (x1 + x2) // 2, (y1 + y2) // 2
    raise AssertionError(f"{text!r} not on screen")


def test_is_a_driver() -> None:
    assert isinstance(VirtualDriver(VirtualPhone("v")), Driver)


def test_drives_a_task_end_to_end() -> None:
    phone = VirtualPhone("v", width=720, height=1600)
    driver = VirtualDriver(phone)
    assert driver.serial == "v"
    assert driver.screen_size() == (720, 1600)
    assert Image.open(io.BytesIO(driver.screenshot_png())).size == (720, 1600)
    driver.launch_app("com.android.contacts")
    assert driver.current_app() == "com.android.contacts"
    driver.tap(*_center(driver, "Create contact"))
    driver.input_text("Ada Lovelace")
    driver.press_key("enter")
    driver.input_text("555 0100")
    driver.tap(*_center(driver, "Save"))
    assert [(c.name, c.phone) for c in phone.state.contacts] == [("Ada Lovelace", "555 0100")]
    driver.press_key("back")
    driver.press_key("home")
    assert driver.current_app() == "com.android.launcher3"
    driver.launch_app("com.android.settings")
    for _ in range(3):
        driver.swipe(360, 1300, 360, 300, 300)
    driver.long_press(*_center(driver, "About phone"))  # not long-clickable: acts as a click
    assert phone.current_page().name == "about"
    driver.terminate_app("com.android.settings")
    assert driver.current_app() == "com.android.launcher3"


def test_errors_and_unplug() -> None:
    phone = VirtualPhone("v")
    driver = VirtualDriver(phone)
    with pytest.raises(DeviceError):
        driver.launch_app("com.example.missing")
    phone.unplug()
    with pytest.raises(DeviceGone):
        driver.screenshot_png()
    with pytest.raises(DeviceGone):
        driver.tap(1, 1)
    phone.replug()
    assert driver.current_app() == "com.android.launcher3"


def test_unsettled_screen_dump_is_a_device_error() -> None:
    phone = VirtualPhone("v")
    driver = VirtualDriver(phone)
    phone.glitch_dumps("idle")
    with pytest.raises(DeviceError, match="idle state"):
        driver.dump_hierarchy()
    phone.glitch_dumps("npe")
    with pytest.raises(DeviceBusy, match="NullPointerException"):
        driver.dump_hierarchy()
    assert driver.dump_hierarchy().startswith("<?xml")


def test_delete_key_is_backspace() -> None:
    phone = VirtualPhone("v")
    driver = VirtualDriver(phone)
    driver.press_key("delete")  # on the home screen nothing is focused: nothing happens
    assert driver.current_app() == "com.android.launcher3"
    driver.launch_app("com.android.contacts")
    driver.tap(*_center(driver, "Create contact"))
    driver.input_text("Ada!!")
    driver.press_key("delete")
    driver.press_key("delete")
    page = phone.current_page()
    assert page.focus is not None
    assert page.fields[page.focus] == "Ada"
