"""Plain data a virtual phone keeps: system settings, app data, and each app's page stack."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Contact:
    name: str
    phone: str


@dataclass
class Alarm:
    hour: int
    minute: int
    enabled: bool = True
    label: str = ""

    @property
    def time_text(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d}"


def default_settings() -> dict[str, bool | str]:
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
    }


@dataclass
class PhoneState:
    """Everything a task checker may look at; apps read and write it, nothing else is hidden."""

    settings: dict[str, bool | str] = field(default_factory=default_settings)
    contacts: list[Contact] = field(default_factory=list)
    alarms: list[Alarm] = field(default_factory=list)
    calc_expression: str = ""
    calc_result: str = ""
    battery_level: int = 85

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
