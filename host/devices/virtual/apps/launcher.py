"""The home screen: a date line and one icon per installed app."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Page
from host.devices.virtual.widgets import Geometry, text

LAUNCHER_PACKAGE = "com.android.launcher3"
COLUMNS = 4
ICON = 168
CELL_H = 300


class Launcher(App):
    package = LAUNCHER_PACKAGE
    label = "Home"
    activity = "com.android.launcher3.uioverrides.QuickstepLauncher"

    def __init__(self, apps: Sequence[App]) -> None:
        self._apps = list(apps)

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del page
        root = Node(
            "android.view.ViewGroup",
            (0, geo.top, geo.width, geo.bottom),
            resource_id=f"{self.package}:id/workspace",
            role="launcher",
        )
        root.add(
            text(
                (0, geo.top + 80, geo.width, geo.top + 180),
                "Sunday, Nov 29",
                rid=f"{self.package}:id/date",
                size=56,
                align="center",
                role="on_wallpaper",
            )
        )
        cell_w = geo.width // COLUMNS
        grid_top = geo.bottom - 2 * CELL_H - 120
        for i, app in enumerate(self._apps):
            col, row = i % COLUMNS, i // COLUMNS
            x1 = col * cell_w
            y1 = grid_top + row * CELL_H
            icon = Node(
                "android.widget.TextView",
                (x1, y1, x1 + cell_w, y1 + CELL_H),
                text=app.label,
                content_desc=app.label,
                clickable=True,
                focusable=True,
                long_clickable=True,
                role="app_icon",
                font_size=40,
                align="center",
                hint=app.label[:1],
                on_click=partial(_launch, phone, app.package),
                on_long_click=_nothing,
                color=app.icon_color,
            )
            root.add(icon)
        return [root]


def _launch(phone: PhoneApi, package: str) -> None:
    phone.launch(package)


def _nothing() -> None:
    """Long-pressing an icon opens shortcuts on a real launcher; here it does nothing."""
