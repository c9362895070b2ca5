"""Tasks for agents on the virtual phone: a goal in plain words, a starting state, a checker.

Checkers read the phone's end state (settings, contacts, alarms, what is on screen), never the
path the agent took, so any route to the goal counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from host.devices.virtual.apps.launcher import LAUNCHER_PACKAGE
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.state import Alarm, Contact

SETTINGS = "com.android.settings"
CONTACTS = "com.android.contacts"
CLOCK = "com.android.deskclock"
CALCULATOR = "com.android.calculator2"


@dataclass(frozen=True)
class SuiteTask:
    name: str
    goal: str
    setup: Callable[[VirtualPhone], None]
    check: Callable[[VirtualPhone], bool]


def _settings(**values: bool | str) -> Callable[[VirtualPhone], None]:
    """Setup: a factory-fresh phone on the home screen with some settings changed."""

    def setup(phone: VirtualPhone) -> None:
        phone.reset()
        phone.state.settings.update(values)

    return setup


def _is(key: str, value: bool | str) -> Callable[[VirtualPhone], bool]:
    def check(phone: VirtualPhone) -> bool:
        return phone.state.settings.get(key) == value

    return check


def _open_pages(
    package: str, pages: list[str], **values: bool | str
) -> Callable[[VirtualPhone], None]:
    """Setup: start inside an app, several pages deep, so the agent has to back out first."""

    def setup(phone: VirtualPhone) -> None:
        _settings(**values)(phone)
        phone.launch(package)
        for page in pages:
            phone.push(page)

    return setup


def _contacts(*people: tuple[str, str]) -> Callable[[VirtualPhone], None]:
    def setup(phone: VirtualPhone) -> None:
        phone.reset()
        phone.state.contacts.extend(Contact(name, number) for name, number in people)

    return setup


def _has_contact(name: str, number: str) -> Callable[[VirtualPhone], bool]:
    def check(phone: VirtualPhone) -> bool:
        digits = "".join(ch for ch in number if ch.isdigit())
        return any(
            c.name.strip().lower() == name.lower()
            and "".join(ch for ch in c.phone if ch.isdigit()) == digits
            for c in phone.state.contacts
        )

    return check


def _alarms(*alarms: tuple[int, int, bool]) -> Callable[[VirtualPhone], None]:
    def setup(phone: VirtualPhone) -> None:
        phone.reset()
        phone.state.alarms.extend(Alarm(h, m, enabled) for h, m, enabled in alarms)

    return setup


def _alarm_state(phone: VirtualPhone) -> dict[tuple[int, int], bool]:
    return {(a.hour, a.minute): a.enabled for a in phone.state.alarms}


def _check_dark_and_saver(phone: VirtualPhone) -> bool:
    return phone.state.flag("dark_theme") and phone.state.flag("battery_saver")


def _check_alarm_730(phone: VirtualPhone) -> bool:
    return _alarm_state(phone).get((7, 30)) is True


def _check_alarm_2215(phone: VirtualPhone) -> bool:
    return _alarm_state(phone) == {(6, 0): True, (22, 15): True}


def _check_six_off(phone: VirtualPhone) -> bool:
    return _alarm_state(phone) == {(6, 0): False, (8, 15): True}


def _check_nine_45_on(phone: VirtualPhone) -> bool:
    return _alarm_state(phone) == {(9, 45): True, (10, 0): False}


def _check_22_deleted(phone: VirtualPhone) -> bool:
    return _alarm_state(phone) == {(7, 0): True}


def _check_bob_deleted(phone: VirtualPhone) -> bool:
    names = [c.name for c in phone.state.contacts]
    return names == ["Alice Jones"]


def _check_grace(phone: VirtualPhone) -> bool:
    return _has_contact("Grace Hopper", "555 0199")(phone) and len(phone.state.contacts) == 3


def _check_calc_84(phone: VirtualPhone) -> bool:
    return phone.state.calc_result == "84"


def _check_calc_divide(phone: VirtualPhone) -> bool:
    return phone.state.calc_result == "25"


def _check_about_open(phone: VirtualPhone) -> bool:
    return phone.current_package() == SETTINGS and phone.current_page().name == "about"


def _check_home(phone: VirtualPhone) -> bool:
    return phone.current_package() == LAUNCHER_PACKAGE


def _check_wifi_off_and_home(phone: VirtualPhone) -> bool:
    return not phone.state.flag("wifi") and phone.current_package() == LAUNCHER_PACKAGE


SUITE: list[SuiteTask] = [
    SuiteTask("dark_theme_on", "Turn on dark theme", _settings(), _is("dark_theme", True)),
    SuiteTask(
        "dark_theme_off",
        "Turn off dark theme",
        _settings(dark_theme=True),
        _is("dark_theme", False),
    ),
    SuiteTask("wifi_off", "Turn off Wi-Fi", _settings(), _is("wifi", False)),
    SuiteTask("wifi_on", "Turn on Wi-Fi", _settings(wifi=False), _is("wifi", True)),
    SuiteTask("airplane_on", "Turn on airplane mode", _settings(), _is("airplane_mode", True)),
    SuiteTask("dnd_on", "Turn on Do Not Disturb", _settings(), _is("do_not_disturb", True)),
    SuiteTask("battery_saver_on", "Enable battery saver", _settings(), _is("battery_saver", True)),
    SuiteTask("bluetooth_off", "Turn off Bluetooth", _settings(), _is("bluetooth", False)),
    SuiteTask(
        "font_size_large", "Set the font size to Large", _settings(), _is("font_size", "Large")
    ),
    SuiteTask(
        "screen_timeout_5min",
        "Set the screen timeout to 5 minutes",
        _settings(),
        _is("screen_timeout", "5 minutes"),
    ),
    SuiteTask("location_off", "Turn off location", _settings(), _is("location", False)),
    SuiteTask(
        "color_inversion_on",
        "Turn on color inversion in the accessibility settings",
        _settings(),
        _is("color_inversion", True),
    ),
    SuiteTask(
        "use_24_hour_off",
        "Stop using the 24-hour time format",
        _settings(),
        _is("use_24_hour_format", False),
    ),
    SuiteTask(
        "wifi_off_from_deep_page",
        "Turn off Wi-Fi",
        _open_pages(SETTINGS, ["display", "font_size"]),
        _is("wifi", False),
    ),
    SuiteTask(
        "dark_theme_and_saver",
        "Turn on dark theme and enable battery saver",
        _settings(),
        _check_dark_and_saver,
    ),
    SuiteTask(
        "about_phone",
        "Open the About phone page in Settings",
        _settings(),
        _check_about_open,
    ),
    SuiteTask(
        "go_home",
        "Leave the alarm editor and go back to the home screen",
        _open_pages(CLOCK, ["add_alarm"]),
        _check_home,
    ),
    SuiteTask(
        "wifi_off_then_home",
        "Turn off Wi-Fi, then return to the home screen",
        _settings(),
        _check_wifi_off_and_home,
    ),
    SuiteTask(
        "create_contact_ada",
        "Create a contact named Ada Lovelace with phone 555 0100",
        _contacts(),
        _has_contact("Ada Lovelace", "555 0100"),
    ),
    SuiteTask(
        "create_contact_grace",
        "Add Grace Hopper to the contacts with the number 555 0199",
        _contacts(("Alice Jones", "555 0001"), ("Bob Smith", "555 0002")),
        _check_grace,
    ),
    SuiteTask(
        "delete_contact_bob",
        "Delete the contact Bob Smith",
        _contacts(("Alice Jones", "555 0001"), ("Bob Smith", "555 0002")),
        _check_bob_deleted,
    ),
    SuiteTask("alarm_0730", "Add an alarm for 7:30", _alarms(), _check_alarm_730),
    SuiteTask(
        "alarm_2215",
        "Set an alarm for 10:15 PM",
        _alarms((6, 0, True)),
        _check_alarm_2215,
    ),
    SuiteTask(
        "alarm_disable_0600",
        "Turn off the 6:00 alarm",
        _alarms((6, 0, True), (8, 15, True)),
        _check_six_off,
    ),
    SuiteTask(
        "alarm_enable_0945",
        "Turn on the 9:45 alarm",
        _alarms((9, 45, False), (10, 0, False)),
        _check_nine_45_on,
    ),
    SuiteTask(
        "alarm_delete_2200",
        "Delete the 22:00 alarm",
        _alarms((7, 0, True), (22, 0, True)),
        _check_22_deleted,
    ),
    SuiteTask(
        "calc_multiply",
        "Use the calculator to work out 12 times 7",
        _settings(),
        _check_calc_84,
    ),
    SuiteTask(
        "calc_divide",
        "Use the calculator to divide 100 by 4",
        _settings(),
        _check_calc_divide,
    ),
]
