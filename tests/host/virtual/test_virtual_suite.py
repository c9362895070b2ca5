"""Every suite task is reachable over adb, no checker passes on the task's starting state, and a
verdict catches anything changed beyond the goal.

Each scripted solution uses only adbutils (dump, tap, swipe, text, keys), so it walks the same
path an agent on the adbutils driver would, through the same interruptions (a permission
prompt, an ANR, the shade, a toast) the task throws.
"""

from __future__ import annotations

from collections.abc import Callable

import adbutils
import pytest

from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.state import Contact
from host.devices.virtual.suite import HELD_OUT, SUITE, SuiteTask, snapshot
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
    """Type into the time picker's columns (tapping one selects its value), hide the keyboard
    that covers Save, save."""

    def solve(s: AdbScript) -> None:
        s.launch(CLOCK)
        s.tap("Add alarm")
        hour_input, minute_input = s.nodes_with(rid="android:id/numberpicker_input")[:2]
        s.click_node(hour_input)
        s.type(hour)
        s.click_node(minute_input)
        s.type(minute)
        s.key("KEYCODE_BACK")
        s.tap("Save")

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


def _through_anr(s: AdbScript) -> None:
    _settings_path("Sound & vibration", "Do Not Disturb")(s)  # the ANR comes up after this
    s.tap("Wait")


def _through_shade(s: AdbScript) -> None:
    _settings_path("Display", "Screen timeout")(s)  # the shade comes down after this
    s.key("KEYCODE_BACK")  # closes the shade, nothing else
    s.tap("2 minutes")


def _alarm_after_prompt(s: AdbScript) -> None:
    s.launch(CLOCK)
    s.tap("Don’t allow")
    s.tap("Add alarm")
    minute = s.nodes_with(rid="android:id/numberpicker_input")[1]
    s.click_node(minute)
    s.type("45")
    s.key("KEYCODE_BACK")
    s.tap("Save")


def _note(s: AdbScript) -> None:
    s.launch("com.amc.notes")
    s.tap("New note")
    s.type("Groceries")  # the title field has focus when the editor opens
    s.tap("Note")
    s.type("milk and eggs")
    s.key("KEYCODE_BACK")  # the keyboard covers Save
    s.tap("Save")


def _delete_in_long_list(s: AdbScript) -> None:
    s.launch(CONTACTS)
    s.tap("Zeno Zanetti", scrolls=8)
    s.tap("Delete")


def _dark_from_scrolled(s: AdbScript) -> None:
    s.launch(SETTINGS)  # resumes at the bottom of its list
    for _ in range(6):
        s.scroll_up()
    s.tap("Display")
    s.tap("Dark theme")


def _wifi_on_locked(s: AdbScript) -> None:
    s.key("KEYCODE_WAKEUP")
    s.d.shell("wm dismiss-keyguard")
    _settings_path("Network & internet", "Wi-Fi")(s)


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
    "alarm_after_permission_prompt": _alarm_after_prompt,
    "dnd_through_anr": _through_anr,
    "timeout_through_shade": _through_shade,
    "delete_bob_through_toast": _delete_bob,
    "note_save_under_keyboard": _note,
    "delete_contact_in_long_list": _delete_in_long_list,
    "dark_theme_from_scrolled_settings": _dark_from_scrolled,
    "wifi_on_asleep_and_locked": _wifi_on_locked,
    "airplane_on_pixel_launcher": _settings_path("Network & internet", "Airplane mode"),
    "german_wifi_off": _settings_path("Netzwerk & Internet", "WLAN"),
    "german_battery_saver_on": _settings_path("Akku", "Energiesparmodus"),
    "data_saver_on": _settings_path("Network & internet", "Data Saver"),
    "battery_percentage_shown": _settings_path("Battery", "Battery percentage"),
    "wifi_off_words_after": _settings_path("Network & internet", "Wi-Fi"),
    "want_dark_mode": _settings_path("Display", "Dark theme"),
    "put_in_airplane_mode": _settings_path("Network & internet", "Airplane mode"),
    "held_bluetooth_disable": _settings_path("Connected devices", "Bluetooth"),
    "held_location_switch_off": _settings_path("Location", "Use location"),
    "held_inversion_enable": _settings_path("Accessibility", "Color inversion"),
    "held_auto_rotate_on": _settings_path("Display", "Auto-rotate screen"),
    "held_vibrate_off": _settings_path("Sound & vibration", "Vibrate for calls"),
    "held_dnd_please": _settings_path("Sound & vibration", "Do Not Disturb"),
    "held_contact_linus": _new_contact("Linus Torvalds", "555 0142"),
    "held_alarm_0615": _new_alarm("6", "15"),
}


def test_suite_is_big_enough_and_every_task_has_a_solution() -> None:
    names = [t.name for t in [*SUITE, *HELD_OUT]]
    assert len(SUITE) >= 40
    assert len(set(names)) == len(names)
    assert set(SOLUTIONS) == set(names)
    assert all(t.goal and t.goal[0].isupper() for t in [*SUITE, *HELD_OUT])
    tags = set().union(*(t.tags for t in SUITE))
    assert {"permission_prompt", "keyboard", "long_list", "locale"} <= tags


@pytest.mark.parametrize("task", [*SUITE, *HELD_OUT], ids=lambda t: t.name)
def test_task_is_reachable_over_adb_and_changes_nothing_else(task: SuiteTask) -> None:
    phone = task.new_phone("virt-suite")
    before = snapshot(phone)
    assert not task.check(phone), "the checker must fail on the starting state"
    with ThreadedAdbServer([phone]) as server:
        client = adbutils.AdbClient(host="127.0.0.1", port=server.port, socket_timeout=20)
        SOLUTIONS[task.name](AdbScript(client.device(phone.serial)))
    verdict = task.verdict(phone, before)
    assert verdict.goal_met
    assert verdict.unrequested == []


def test_a_verdict_names_every_unrequested_change() -> None:
    task = next(t for t in SUITE if t.name == "data_saver_on")
    phone = task.new_phone()
    before = snapshot(phone)
    phone.state.settings["data_saver"] = True
    phone.state.settings["battery_saver"] = True  # flipped on the way: not the goal
    phone.state.contacts.append(Contact("Someone", "1"))
    verdict = task.verdict(phone, before)
    assert verdict.goal_met and not verdict.passed
    assert verdict.unrequested == ["contacts", "settings.battery_saver"]


def test_declining_a_permission_is_no_change_but_granting_is() -> None:
    task = next(t for t in SUITE if t.name == "alarm_after_permission_prompt")
    for answer, changed in (("Don’t allow", []), ("Allow", ["permissions."])):
        phone = task.new_phone()
        before = snapshot(phone)
        phone.launch("com.android.deskclock")
        node = phone.find(answer)
        assert node is not None
        phone.tap(*_center(node.bounds))
        unrequested = task.verdict(phone, before).unrequested
        assert [u[: len("permissions.")] for u in unrequested] == changed


def _center(b: tuple[int, int, int, int]) -> tuple[int, int]:
    return (b[0] + b[2]) // 2, (b[1] + b[3]) // 2


def test_wrong_end_states_fail_the_checkers(phone: VirtualPhone) -> None:
    by_name = {t.name: t for t in SUITE}
    grace = by_name["create_contact_grace"]
    grace.setup(phone)
    phone.state.contacts.clear()  # the agent deleted the others on the way: not the goal
    phone.state.contacts.append(Contact("Grace Hopper", "555-0199"))
    assert not grace.check(phone)
    six = by_name["alarm_disable_0600"]
    six.setup(phone)
    for alarm in phone.state.alarms:
        alarm.enabled = False  # turned every alarm off, not just the 6:00 one
    assert not six.check(phone)
