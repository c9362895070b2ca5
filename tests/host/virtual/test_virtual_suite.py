"""Every suite task is reachable over adb, and no checker passes on the task's starting state.

Each scripted solution uses only adbutils (dump, tap, swipe, text, keys), so it walks the same
path an agent on the adbutils driver would.
"""

from __future__ import annotations

from collections.abc import Callable

import adbutils
import pytest

from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.suite import SUITE, SuiteTask
from tests.host.virtual.virtual_adb_script import AdbScript

SETTINGS = "com.android.settings"
CONTACTS = "com.android.contacts"
CLOCK = "com.android.deskclock"
CALC = "com.android.calculator2"


def _settings_path(*steps: str) -> Callable[[AdbScript], None]:
    def solve(s: AdbScript) -> None:
        s.launch(SETTINGS)
        for step in steps:
            s.tap(step)

    return solve


def _new_contact(name: str, number: str) -> Callable[[AdbScript], None]:
    def solve(s: AdbScript) -> None:
        s.launch(CONTACTS)
        s.tap("Create contact")
        s.type(name)  # the name field is focused when the editor opens
        s.tap("Phone")
        s.type(number)
        s.tap("Save")

    return solve


def _new_alarm(hour: str, minute: str) -> Callable[[AdbScript], None]:
    def solve(s: AdbScript) -> None:
        s.launch(CLOCK)
        s.tap("Add alarm")
        s.type(hour)
        s.tap("Minute (0-59)")
        s.type(minute)
        s.tap("OK")

    return solve


def _clock_tap(desc: str) -> Callable[[AdbScript], None]:
    def solve(s: AdbScript) -> None:
        s.launch(CLOCK)
        s.tap(desc)

    return solve


def _calculator(*keys: str) -> Callable[[AdbScript], None]:
    def solve(s: AdbScript) -> None:
        s.launch(CALC)
        for key in keys:
            s.tap(rid=f"{CALC}:id/{key}")

    return solve


def _wifi_off_from_deep_page(s: AdbScript) -> None:
    s.launch(SETTINGS)  # resumes on Display > Font size
    s.key("KEYCODE_BACK")
    s.key("KEYCODE_BACK")
    s.tap("Network & internet")
    s.tap("Wi-Fi")


def _dark_and_saver(s: AdbScript) -> None:
    _settings_path("Display", "Dark theme")(s)
    s.tap("Navigate up")
    s.tap("Battery")
    s.tap("Battery Saver")


def _go_home(s: AdbScript) -> None:
    s.launch(CLOCK)  # resumes on the alarm editor
    s.key("KEYCODE_BACK")
    s.key("KEYCODE_BACK")


def _wifi_off_then_home(s: AdbScript) -> None:
    _settings_path("Network & internet", "Wi-Fi")(s)
    s.key("KEYCODE_HOME")


def _delete_bob(s: AdbScript) -> None:
    s.launch(CONTACTS)
    s.tap("Bob Smith")
    s.tap("Delete")


SOLUTIONS: dict[str, Callable[[AdbScript], None]] = {
    "dark_theme_on": _settings_path("Display", "Dark theme"),
    "dark_theme_off": _settings_path("Display", "Dark theme"),
    "wifi_off": _settings_path("Network & internet", "Wi-Fi"),
    "wifi_on": _settings_path("Network & internet", "Wi-Fi"),
    "airplane_on": _settings_path("Network & internet", "Airplane mode"),
    "dnd_on": _settings_path("Sound & vibration", "Do Not Disturb"),
    "battery_saver_on": _settings_path("Battery", "Battery Saver"),
    "bluetooth_off": _settings_path("Connected devices", "Bluetooth"),
    "font_size_large": _settings_path("Display", "Font size", "Large"),
    "screen_timeout_5min": _settings_path("Display", "Screen timeout", "5 minutes"),
    "location_off": _settings_path("Location", "Use location"),
    "color_inversion_on": _settings_path("Accessibility", "Color inversion"),
    "use_24_hour_off": _settings_path("System", "Date & time", "Use 24-hour format"),
    "wifi_off_from_deep_page": _wifi_off_from_deep_page,
    "dark_theme_and_saver": _dark_and_saver,
    "about_phone": _settings_path("About phone"),
    "go_home": _go_home,
    "wifi_off_then_home": _wifi_off_then_home,
    "create_contact_ada": _new_contact("Ada Lovelace", "555 0100"),
    "create_contact_grace": _new_contact("Grace Hopper", "555 0199"),
    "delete_contact_bob": _delete_bob,
    "alarm_0730": _new_alarm("7", "30"),
    "alarm_2215": _new_alarm("22", "15"),
    "alarm_disable_0600": _clock_tap("06:00 alarm"),
    "alarm_enable_0945": _clock_tap("09:45 alarm"),
    "alarm_delete_2200": _clock_tap("Delete 22:00 alarm"),
    "calc_multiply": _calculator("digit_1", "digit_2", "op_mul", "digit_7", "eq"),
    "calc_divide": _calculator("digit_1", "digit_0", "digit_0", "op_div", "digit_4", "eq"),
}


def test_suite_is_big_enough_and_every_task_has_a_solution() -> None:
    names = [t.name for t in SUITE]
    assert len(names) >= 20
    assert len(set(names)) == len(names)
    assert set(SOLUTIONS) == set(names)
    assert all(t.goal and t.goal[0].isupper() for t in SUITE)


@pytest.mark.parametrize("task", SUITE, ids=lambda t: t.name)
def test_task_is_reachable_over_adb(
    task: SuiteTask, phone: VirtualPhone, device: adbutils.AdbDevice
) -> None:
    task.setup(phone)
    assert not task.check(phone), "the checker must fail on the starting state"
    SOLUTIONS[task.name](AdbScript(device))
    assert task.check(phone)


def test_wrong_end_states_fail_the_checkers(phone: VirtualPhone) -> None:
    by_name = {t.name: t for t in SUITE}
    grace = by_name["create_contact_grace"]
    grace.setup(phone)
    phone.state.contacts.clear()  # the agent deleted the others on the way: not the goal
    from host.devices.virtual.state import Contact

    phone.state.contacts.append(Contact("Grace Hopper", "555-0199"))
    assert not grace.check(phone)
    six = by_name["alarm_disable_0600"]
    six.setup(phone)
    for alarm in phone.state.alarms:
        alarm.enabled = False  # turned every alarm off, not just the 6:00 one
    assert not six.check(phone)
