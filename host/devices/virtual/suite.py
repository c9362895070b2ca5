"""Tasks for agents on the virtual phone: a goal in plain words, a starting state, a checker.

Checkers read the phone's end state (settings, contacts, alarms, notes, permissions, what is
on screen), never the path the agent took, so any route to the goal counts. Every task also
names what its goal may change (`changes`); `SuiteTask.verdict` compares the whole phone state
before and after, so a task passes only when the goal is met *and nothing else changed*: a
switch flipped on the way, a permission granted that the goal did not need, a contact lost.

Some tasks meet what real phones do: a permission prompt when an app starts for the first time,
"System UI isn't responding", the notification shade or a toast thrown in mid-task, the
keyboard covering a Save button, a list longer than the screen, Settings left scrolled down, a
sleeping swipe-locked phone, a German phone, a vendor's launcher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from host.devices.virtual.apps.launcher import LAUNCHER_PACKAGE
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.state import NOTIFICATIONS, Alarm, Contact, Note, permission_key

SETTINGS = "com.android.settings"
CONTACTS = "com.android.contacts"
CLOCK = "com.android.deskclock"
CALCULATOR = "com.android.calculator2"
NOTES = "com.amc.notes"
PIXEL_LAUNCHER = "com.google.android.apps.nexuslauncher"

Snapshot = dict[str, object]


def snapshot(phone: VirtualPhone) -> Snapshot:
    """Everything on the phone a user would call "my data or my settings", flattened:
    `settings.<key>`, `permissions.<package:permission>`, `contacts`, `alarms`, `notes`,
    `calc`. (Screens, scroll positions and focus are not data.)"""
    s = phone.state
    out: Snapshot = {f"settings.{k}": v for k, v in s.settings.items()}
    out.update({f"permissions.{k}": v for k, v in s.permissions.items()})
    out["contacts"] = tuple(
        sorted((c.name, "".join(filter(str.isdigit, c.phone))) for c in s.contacts)
    )
    out["alarms"] = tuple(sorted((a.hour, a.minute, a.enabled, a.label) for a in s.alarms))
    out["notes"] = tuple(sorted((n.title, n.body) for n in s.notes))
    out["calc"] = (s.calc_expression, s.calc_result)
    return out


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """Keys whose value differs. A permission the app never had and still does not have
    (asked, then denied) is no change: declining leaves the phone as it was."""
    out = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if key.startswith("permissions.") and old in (None, "denied") and new in (None, "denied"):
            continue
        out.append(key)
    return out


@dataclass(frozen=True)
class Verdict:
    goal_met: bool
    unrequested: list[str]

    @property
    def passed(self) -> bool:
        return self.goal_met and not self.unrequested


@dataclass(frozen=True)
class SuiteTask:
    name: str
    goal: str
    setup: Callable[[VirtualPhone], None]
    check: Callable[[VirtualPhone], bool]
    #: State keys (or key prefixes, see `snapshot`) the goal may change.
    changes: frozenset[str] = frozenset()
    #: What the task throws at the agent, for reports ("permission_prompt", "keyboard"…).
    tags: frozenset[str] = frozenset()
    locale: str = "en-US"
    launcher: str = LAUNCHER_PACKAGE

    def new_phone(
        self, serial: str = "suite", width: int = 1080, height: int = 2400
    ) -> VirtualPhone:
        """A phone this task runs on (its locale and launcher), set up and ready."""
        phone = VirtualPhone(serial, width, height, locale=self.locale, launcher=self.launcher)
        self.setup(phone)
        return phone

    def verdict(self, phone: VirtualPhone, before: Snapshot) -> Verdict:
        allowed = tuple(self.changes)
        unrequested = [
            key
            for key in changed(before, snapshot(phone))
            if not any(key == a or key.startswith(a + ".") for a in allowed)
        ]
        return Verdict(self.check(phone), unrequested)


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


def _toggle(name: str, goal: str, key: str, value: bool | str, **start: bool | str) -> SuiteTask:
    """A task whose goal is one setting at one value (and nothing else changed)."""
    return SuiteTask(
        name, goal, _settings(**start), _is(key, value), frozenset({f"settings.{key}"})
    )


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


def _settings_scrolled_down(phone: VirtualPhone) -> None:
    """Setup: Settings left open at the bottom of its list (the agent must scroll back up)."""
    phone.reset()
    phone.launch(SETTINGS)
    phone.current_page().scroll["list"] = 10_000


def _contacts(*people: tuple[str, str]) -> Callable[[VirtualPhone], None]:
    def setup(phone: VirtualPhone) -> None:
        phone.reset()
        phone.state.contacts.extend(Contact(name, number) for name, number in people)

    return setup


_FIRST = (
    "Aaron Bella Carlos Dana Elif Farid Greta Hiro Ines Jonas Kemal Lena Mateo Nadia Omar Pia "
    "Quinn Rosa Sven Tariq Ugo Vera Wanda Xavier Yara Zeno Yusuf Ziva Zoe Zack"
)
_LAST = (
    "Adams Brook Cruz Diaz Ersoy Farah Graf Hayashi Ito Jansen Kaya Lund Moreno Nouri Okafor "
    "Persson Quist Rossi Stahl Tahir Udeh Varga Wolff Xu Yilmaz Zanetti Zamani Zorić Zimmer Zhou"
)
#: Thirty people: the list is four screens long.
MANY_PEOPLE = [
    (f"{first} {last}", f"555 {1000 + i:04d}")
    for i, (first, last) in enumerate(zip(_FIRST.split(" "), _LAST.split(" "), strict=True))
]


def _has_contact(name: str, number: str) -> Callable[[VirtualPhone], bool]:
    def check(phone: VirtualPhone) -> bool:
        digits = "".join(ch for ch in number if ch.isdigit())
        return any(
            c.name.strip().lower() == name.lower()
            and "".join(ch for ch in c.phone if ch.isdigit()) == digits
            for c in phone.state.contacts
        )

    return check


def _without_contact(name: str) -> Callable[[VirtualPhone], bool]:
    def check(phone: VirtualPhone) -> bool:
        return all(c.name != name for c in phone.state.contacts)

    return check


def _alarms(*alarms: tuple[int, int, bool]) -> Callable[[VirtualPhone], None]:
    def setup(phone: VirtualPhone) -> None:
        phone.reset()
        phone.state.alarms.extend(Alarm(h, m, enabled) for h, m, enabled in alarms)

    return setup


def _alarm_state(phone: VirtualPhone) -> dict[tuple[int, int], bool]:
    return {(a.hour, a.minute): a.enabled for a in phone.state.alarms}


def _has_alarm(hour: int, minute: int) -> Callable[[VirtualPhone], bool]:
    def check(phone: VirtualPhone) -> bool:
        return _alarm_state(phone).get((hour, minute)) is True

    return check


def _first_clock_start(phone: VirtualPhone) -> None:
    """Setup: Clock freshly installed: it asks for the notification permission on its first
    start (Android 13+), before the agent can do anything in it."""
    phone.reset()
    phone.state.permissions.pop(permission_key(CLOCK, NOTIFICATIONS), None)


def _after(
    events: int, throw: Callable[[VirtualPhone], None], **values: bool | str
) -> Callable[[VirtualPhone], None]:
    """Setup: a fresh phone that throws an interruption after the agent's `events`-th action."""

    def setup(phone: VirtualPhone) -> None:
        _settings(**values)(phone)
        phone.interrupt_after(events, lambda: throw(phone))

    return setup


def _asleep_swipe_locked_wifi_off(phone: VirtualPhone) -> None:
    """Setup: Wi-Fi off, the screen asleep behind a swipe lock (no credential)."""
    phone.reset()
    phone.state.settings["wifi"] = False
    phone.set_screen_lock("swipe")
    phone.sleep()


def _two_contacts_toast_after_first_step(phone: VirtualPhone) -> None:
    _contacts(("Alice Jones", "555 0001"), ("Bob Smith", "555 0002"))(phone)
    phone.interrupt_after(1, lambda: phone.show_toast("Backup complete", 30.0))


def _has_note(title: str, *words: str) -> Callable[[VirtualPhone], bool]:
    def check(phone: VirtualPhone) -> bool:
        return any(
            n.title.strip().lower() == title.lower()
            and all(w.lower() in n.body.lower() for w in words)
            for n in phone.state.notes
        )

    return check


def _with_notes(*notes: tuple[str, str]) -> Callable[[VirtualPhone], None]:
    def setup(phone: VirtualPhone) -> None:
        phone.reset()
        phone.state.notes.extend(Note(t, b) for t, b in notes)

    return setup


def _check_dark_and_saver(phone: VirtualPhone) -> bool:
    return phone.state.flag("dark_theme") and phone.state.flag("battery_saver")


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


def _check_calc(result: str) -> Callable[[VirtualPhone], bool]:
    def check(phone: VirtualPhone) -> bool:
        return phone.state.calc_result == result

    return check


def _check_about_open(phone: VirtualPhone) -> bool:
    return phone.current_package() == SETTINGS and phone.current_page().name == "about"


def _check_home(phone: VirtualPhone) -> bool:
    return phone.current_package() == phone.launcher_package


def _check_wifi_off_and_home(phone: VirtualPhone) -> bool:
    return not phone.state.flag("wifi") and phone.current_package() == phone.launcher_package


_S = "settings."
CONTACTS_CHANGE = frozenset({"contacts"})
ALARMS_CHANGE = frozenset({"alarms"})
CALC_CHANGE = frozenset({"calc"})

SUITE: list[SuiteTask] = [
    _toggle("dark_theme_on", "Turn on dark theme", "dark_theme", True),
    _toggle("dark_theme_off", "Turn off dark theme", "dark_theme", False, dark_theme=True),
    _toggle("wifi_off", "Turn off Wi-Fi", "wifi", False),
    _toggle("wifi_on", "Turn on Wi-Fi", "wifi", True, wifi=False),
    _toggle("airplane_on", "Turn on airplane mode", "airplane_mode", True),
    _toggle("dnd_on", "Turn on Do Not Disturb", "do_not_disturb", True),
    _toggle("battery_saver_on", "Enable battery saver", "battery_saver", True),
    _toggle("bluetooth_off", "Turn off Bluetooth", "bluetooth", False),
    _toggle("font_size_large", "Set the font size to Large", "font_size", "Large"),
    SuiteTask(
        "screen_timeout_5min",
        "Set the screen timeout to 5 minutes",
        _settings(),
        _is("screen_timeout", "5 minutes"),
        frozenset({f"{_S}screen_timeout"}),
    ),
    _toggle("location_off", "Turn off location", "location", False),
    _toggle(
        "color_inversion_on",
        "Turn on color inversion in the accessibility settings",
        "color_inversion",
        True,
    ),
    _toggle("use_24_hour_off", "Stop using the 24-hour time format", "use_24_hour_format", False),
    SuiteTask(
        "wifi_off_from_deep_page",
        "Turn off Wi-Fi",
        _open_pages(SETTINGS, ["display", "font_size"]),
        _is("wifi", False),
        frozenset({f"{_S}wifi"}),
    ),
    SuiteTask(
        "dark_theme_and_saver",
        "Turn on dark theme and enable battery saver",
        _settings(),
        _check_dark_and_saver,
        frozenset({f"{_S}dark_theme", f"{_S}battery_saver"}),
    ),
    SuiteTask(
        "about_phone", "Open the About phone page in Settings", _settings(), _check_about_open
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
        frozenset({f"{_S}wifi"}),
    ),
    SuiteTask(
        "create_contact_ada",
        "Create a contact named Ada Lovelace with phone 555 0100",
        _contacts(),
        _has_contact("Ada Lovelace", "555 0100"),
        CONTACTS_CHANGE,
        frozenset({"keyboard"}),
    ),
    SuiteTask(
        "create_contact_grace",
        "Add Grace Hopper to the contacts with the number 555 0199",
        _contacts(("Alice Jones", "555 0001"), ("Bob Smith", "555 0002")),
        _check_grace,
        CONTACTS_CHANGE,
        frozenset({"keyboard"}),
    ),
    SuiteTask(
        "delete_contact_bob",
        "Delete the contact Bob Smith",
        _contacts(("Alice Jones", "555 0001"), ("Bob Smith", "555 0002")),
        _check_bob_deleted,
        CONTACTS_CHANGE,
    ),
    SuiteTask(
        "alarm_0730",
        "Add an alarm for 7:30",
        _alarms(),
        _has_alarm(7, 30),
        ALARMS_CHANGE,
        frozenset({"time_picker", "keyboard"}),
    ),
    SuiteTask(
        "alarm_2215",
        "Set an alarm for 10:15 PM",
        _alarms((6, 0, True)),
        _check_alarm_2215,
        ALARMS_CHANGE,
        frozenset({"time_picker", "keyboard"}),
    ),
    SuiteTask(
        "alarm_disable_0600",
        "Turn off the 6:00 alarm",
        _alarms((6, 0, True), (8, 15, True)),
        _check_six_off,
        ALARMS_CHANGE,
    ),
    SuiteTask(
        "alarm_enable_0945",
        "Turn on the 9:45 alarm",
        _alarms((9, 45, False), (10, 0, False)),
        _check_nine_45_on,
        ALARMS_CHANGE,
    ),
    SuiteTask(
        "alarm_delete_2200",
        "Delete the 22:00 alarm",
        _alarms((7, 0, True), (22, 0, True)),
        _check_22_deleted,
        ALARMS_CHANGE,
    ),
    SuiteTask(
        "calc_multiply",
        "Use the calculator to work out 12 times 7",
        _settings(),
        _check_calc("84"),
        CALC_CHANGE,
    ),
    SuiteTask(
        "calc_divide",
        "Use the calculator to divide 100 by 4",
        _settings(),
        _check_calc("25"),
        CALC_CHANGE,
    ),
    # --- real phones are messy --------------------------------------------------------------
    SuiteTask(
        "alarm_after_permission_prompt",
        "Set an alarm for 6:45",
        _first_clock_start,
        _has_alarm(6, 45),
        ALARMS_CHANGE,
        frozenset({"permission_prompt", "time_picker", "keyboard"}),
    ),
    SuiteTask(
        "dnd_through_anr",
        "Turn on Do Not Disturb",
        _after(2, lambda p: p.show_anr()),
        _is("do_not_disturb", True),
        frozenset({f"{_S}do_not_disturb"}),
        frozenset({"app_not_responding"}),
    ),
    SuiteTask(
        "timeout_through_shade",
        "Set the screen timeout to 2 minutes",
        _after(2, lambda p: p.open_shade()),
        _is("screen_timeout", "2 minutes"),
        frozenset({f"{_S}screen_timeout"}),
        frozenset({"notification_shade"}),
    ),
    SuiteTask(
        "delete_bob_through_toast",
        "Delete the contact Bob Smith",
        _two_contacts_toast_after_first_step,
        _check_bob_deleted,
        CONTACTS_CHANGE,
        frozenset({"toast"}),
    ),
    SuiteTask(
        "note_save_under_keyboard",
        'Create a note titled "Groceries" that says "milk and eggs"',
        _with_notes(),
        _has_note("Groceries", "milk", "eggs"),
        frozenset({"notes"}),
        frozenset({"keyboard", "compose"}),
    ),
    SuiteTask(
        "delete_contact_in_long_list",
        "Delete the contact Zeno Zanetti",
        _contacts(*MANY_PEOPLE),
        _without_contact("Zeno Zanetti"),
        CONTACTS_CHANGE,
        frozenset({"long_list"}),
    ),
    SuiteTask(
        "dark_theme_from_scrolled_settings",
        "Turn on dark theme",
        _settings_scrolled_down,
        _is("dark_theme", True),
        frozenset({f"{_S}dark_theme"}),
        frozenset({"scrolled"}),
    ),
    SuiteTask(
        "wifi_on_asleep_and_locked",
        "Turn on Wi-Fi",
        _asleep_swipe_locked_wifi_off,
        _is("wifi", True),
        frozenset({f"{_S}wifi"}),
        frozenset({"lock_screen"}),
    ),
    SuiteTask(
        "airplane_on_pixel_launcher",
        "Turn on airplane mode",
        _settings(),
        _is("airplane_mode", True),
        frozenset({f"{_S}airplane_mode"}),
        frozenset({"vendor_launcher"}),
        launcher=PIXEL_LAUNCHER,
    ),
    SuiteTask(
        "german_wifi_off",
        "Schalte das WLAN aus",
        _settings(),
        _is("wifi", False),
        frozenset({f"{_S}wifi"}),
        frozenset({"locale"}),
        locale="de-DE",
    ),
    SuiteTask(
        "german_battery_saver_on",
        "Aktiviere den Energiesparmodus",
        _settings(),
        _is("battery_saver", True),
        frozenset({f"{_S}battery_saver"}),
        frozenset({"locale"}),
        locale="de-DE",
    ),
    # --- goals worded as people say them (from issue 16) ------------------------------------
    _toggle("data_saver_on", "Switch Data Saver on", "data_saver", True),
    _toggle("battery_percentage_shown", "Show the battery percentage", "battery_percentage", True),
    _toggle("wifi_off_words_after", "Turn Wi-Fi off", "wifi", False),
    _toggle("want_dark_mode", "I want dark mode", "dark_theme", True),
    _toggle("put_in_airplane_mode", "Put the phone in airplane mode", "airplane_mode", True),
]

#: Goals the offline planner was never tuned on (written before its changes for issue 16):
#: reported beside the suite as an honest read on unseen wording.
HELD_OUT: list[SuiteTask] = [
    _toggle("held_bluetooth_disable", "Disable Bluetooth", "bluetooth", False),
    _toggle("held_location_switch_off", "Switch off location", "location", False),
    _toggle("held_inversion_enable", "Enable color inversion", "color_inversion", True),
    _toggle("held_auto_rotate_on", "Turn auto-rotate on", "auto_rotate", True),
    _toggle("held_vibrate_off", "Stop vibrating for calls", "vibrate_for_calls", False),
    _toggle("held_dnd_please", "Please switch Do Not Disturb on", "do_not_disturb", True),
    SuiteTask(
        "held_contact_linus",
        "Save a new contact called Linus Torvalds, number 555 0142",
        _contacts(),
        _has_contact("Linus Torvalds", "555 0142"),
        CONTACTS_CHANGE,
    ),
    SuiteTask(
        "held_alarm_0615",
        "Wake me up at 6:15 am",
        _alarms(),
        _has_alarm(6, 15),
        ALARMS_CHANGE,
    ),
]
