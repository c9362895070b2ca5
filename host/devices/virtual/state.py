"""Plain data a virtual phone keeps: system settings, app data, and each app's page stack."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Contact:
    name: str
    phone: str


@dataclass
class Note:
    title: str
    body: str = ""


@dataclass
class Alarm:
    hour: int
    minute: int
    enabled: bool = True
    label: str = ""

    @property
    def time_text(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d}"


Setting = bool | str | int


def default_settings() -> dict[str, Setting]:
    """Factory settings: what a fresh phone looks like before a task's setup changes it."""
    return {
        "wifi": True,
        "airplane_mode": False,
        "data_saver": False,
        "bluetooth": True,
        "dark_theme": False,
        "adaptive_brightness": True,
        "auto_rotate": False,
        "font_size": "Default",
        "screen_timeout": "30 seconds",
        "do_not_disturb": False,
        "vibrate_for_calls": True,
        "battery_saver": False,
        "battery_percentage": False,
        "location": True,
        "color_inversion": False,
        "use_24_hour_format": True,
        "auto_time": True,
        "brightness": 128,
    }


#: A runtime permission's key in `PhoneState.permissions`: "package:permission".
def permission_key(package: str, permission: str) -> str:
    return f"{package}:{permission}"


NOTIFICATIONS = "android.permission.POST_NOTIFICATIONS"


def default_permissions() -> dict[str, str]:
    """A phone in use: the apps that ask for a runtime permission were answered long ago."""
    return {permission_key("com.android.deskclock", NOTIFICATIONS): "granted"}


@dataclass
class PhoneState:
    """Everything a task checker may look at; apps read and write it, nothing else is hidden."""

    settings: dict[str, Setting] = field(default_factory=default_settings)
    contacts: list[Contact] = field(default_factory=list)
    alarms: list[Alarm] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    calc_expression: str = ""
    calc_result: str = ""
    battery_level: int = 85
    #: Runtime permissions the user answered: "package:permission" -> "granted" | "denied".
    #: A key that is missing was never asked: the app asks on its next start.
    permissions: dict[str, str] = field(default_factory=default_permissions)

    def flag(self, key: str) -> bool:
        return bool(self.settings.get(key, False))


@dataclass
class Page:
    """One screen on an app's back stack, with what the user has done on it so far."""

    name: str
    params: dict[str, str] = field(default_factory=dict)
    scroll: dict[str, int] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    focus: str | None = None
    error: str = ""
    #: The focused field's text is all selected: the next typed text replaces it (a number
    #: picker's input selects its value when tapped).
    select_all: bool = False
