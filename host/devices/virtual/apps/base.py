"""What an app on the virtual phone is, and what it may ask of the phone it runs on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from host.devices.virtual.layout import Node
from host.devices.virtual.state import Page, PhoneState
from host.devices.virtual.strings import Strings
from host.devices.virtual.widgets import Geometry


class PhoneApi(Protocol):
    """The part of the phone an app drives: its data and its own back stack."""

    @property
    def state(self) -> PhoneState: ...

    @property
    def strings(self) -> Strings:
        """The phone's locale: every string an app draws goes through `strings.tr`."""
        ...

    def show_toast(self, text: str) -> None:
        """A toast over the app for a couple of seconds (drawn, never in the dump)."""
        ...

    def push(self, name: str, /, **params: str) -> None:
        """Open a new page on top of the foreground app's stack."""
        ...

    def pop(self) -> None:
        """Close the top page (the Back key); closing the last page returns to the launcher."""
        ...

    def replace(self, name: str, /, **params: str) -> None:
        """Swap the top page for another one (e.g. a saved editor becomes the detail view)."""
        ...

    def launch(self, package: str) -> bool: ...


class App(ABC):
    """One installed app: a package, its launcher entry and the pages it can show."""

    package: str
    label: str
    activity: str
    icon_color: tuple[int, int, int] = (26, 115, 232)

    def root(self) -> Page:
        return Page("main")

    def activity_for(self, page: Page) -> str:
        """The activity class that shows a page (what `dumpsys window` reports)."""
        del page
        return self.activity

    def page_for_activity(self, activity: str) -> Page | None:
        """The page `am start -n pkg/activity` opens, or None if the app has no such activity."""
        short = self.activity.removeprefix(self.package)
        if activity in (self.activity, short):
            return self.root()
        return None

    def field_order(self, page: Page) -> list[str]:
        """Text fields on a page in focus order (Enter moves to the next one)."""
        del page
        return []

    def first_focus(self, page: Page) -> str | None:
        """The field a page focuses when it opens, as editors do."""
        order = self.field_order(page)
        return order[0] if order else None

    def settle(self, phone: PhoneApi, page: Page) -> None:
        """After each input event: take what is pending (a number picker's typed value once
        focus has left it). Most pages have nothing to settle."""
        del phone, page

    def keyboard_on_open(self, page: Page) -> bool:
        """Whether the on-screen keyboard comes up when the page opens (an editor that asks
        for it, `stateVisible`); otherwise it comes up when the user taps a field."""
        del page
        return False

    def runtime_permissions(self) -> list[str]:
        """Runtime permissions the app asks for when it starts and has no answer yet."""
        return []

    def compose(self) -> bool:
        """A Jetpack Compose screen: one ComposeView, nodes without resource ids."""
        return False

    @abstractmethod
    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        """The views of a page, laid out inside the app window."""
