"""The home screen: a glance widget, the installed apps, a search bar and a dock, as a real
launcher lays them out (drag layer, workspace, cell layouts, hotseat).

The launcher's package is an option: AOSP's `com.android.launcher3` or a vendor's (Pixel,
Samsung, Motorola, vivo), whose resource ids and activity carry that vendor's package.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Page
from host.devices.virtual.widgets import Geometry, text

LAUNCHER_PACKAGE = "com.android.launcher3"
#: Launcher package → its home activity (what `dumpsys window` reports on the home screen).
LAUNCHERS: dict[str, str] = {
    LAUNCHER_PACKAGE: "com.android.launcher3.uioverrides.QuickstepLauncher",
    "com.google.android.apps.nexuslauncher": (
        "com.google.android.apps.nexuslauncher.NexusLauncherActivity"
    ),
    "com.sec.android.app.launcher": "com.sec.android.app.launcher.activities.LauncherActivity",
    "com.motorola.launcher3": "com.android.launcher3.Launcher",
    "com.bbk.launcher2": "com.bbk.launcher2.Launcher",
}
COLUMNS = 4
CELL_H = 300
DOCK_H = 300
QSB_H = 150


class Launcher(App):
    label = "Home"

    def __init__(
        self, apps: Sequence[App], dock: Sequence[App] = (), package: str = LAUNCHER_PACKAGE
    ) -> None:
        if package not in LAUNCHERS:
            raise ValueError(f"unknown launcher {package!r} (have {', '.join(LAUNCHERS)})")
        self.package = package
        self.activity = LAUNCHERS[package]
        self._apps = list(apps)
        self._dock = list(dock)

    def _icon(self, phone: PhoneApi, app: App, frame: tuple[int, int, int, int]) -> Node:
        label = phone.strings.tr(app.label)
        return Node(
            "android.widget.TextView",
            frame,
            text=label,
            content_desc=label,
            clickable=True,
            focusable=True,
            long_clickable=True,
            role="app_icon",
            font_size=40,
            align="center",
            glyph=label[:1],
            on_click=partial(_launch, phone, app.package),
            on_long_click=_nothing,
            color=app.icon_color,
        )

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del page
        tr = phone.strings.tr
        pkg = self.package
        w = geo.width
        full = (0, geo.top, w, geo.bottom)
        drag = Node(
            "android.widget.FrameLayout", full, resource_id=f"{pkg}:id/drag_layer", role="launcher"
        )
        dock_top = geo.bottom - DOCK_H - QSB_H
        workspace = Node(
            "android.widget.ScrollView",
            (0, geo.top, w, dock_top - 60),
            resource_id=f"{pkg}:id/workspace",
            scrollable=False,
        )
        glance = Node(
            "android.widget.FrameLayout",
            (0, geo.top + 40, w, geo.top + 300),
            resource_id=f"{pkg}:id/search_container_workspace",
        ).add(
            Node(
                "android.view.ViewGroup",
                (40, geo.top + 60, w - 40, geo.top + 280),
                resource_id=f"{pkg}:id/smartspace_card_pager",
            ).add(
                text(
                    (40, geo.top + 80, w - 40, geo.top + 180),
                    tr("Sunday, Nov 29"),
                    rid=f"{pkg}:id/date",
                    size=56,
                    align="center",
                    role="on_wallpaper",
                ),
                # A weather glyph with no label: real home screens have such unlabelled views.
                Node(
                    "android.widget.ImageView",
                    (w // 2 - 40, geo.top + 190, w // 2 + 40, geo.top + 270),
                    resource_id=f"{pkg}:id/subtitle_icon",
                    clickable=True,
                    focusable=True,
                    role="plain",
                    on_click=_nothing,
                ),
            )
        )
        cells = Node("android.view.ViewGroup", workspace.frame, resource_id=f"{pkg}:id/cell_layout")
        shortcuts = Node("android.view.ViewGroup", workspace.frame)
        cell_w = w // COLUMNS
        grid_top = dock_top - 60 - 2 * CELL_H
        for i, app in enumerate(self._apps):
            col, row = i % COLUMNS, i // COLUMNS
            x1 = col * cell_w
            y1 = grid_top + row * CELL_H
            shortcuts.add(self._icon(phone, app, (x1, y1, x1 + cell_w, y1 + CELL_H)))
        workspace.add(glance, cells.add(shortcuts))
        indicator = Node(
            "android.view.View",
            (w // 2 - 60, dock_top - 50, w // 2 + 60, dock_top - 10),
            resource_id=f"{pkg}:id/page_indicator",
            content_desc=tr("Page 1 of 1"),
        )
        hotseat = Node(
            "android.view.ViewGroup",
            (0, dock_top, w, dock_top + DOCK_H),
            resource_id=f"{pkg}:id/hotseat",
        )
        dock_cells = Node("android.view.ViewGroup", hotseat.frame, resource_id=f"{pkg}:id/layout")
        dock_w = w // max(1, len(self._dock))
        for i, app in enumerate(self._dock):
            dock_cells.add(
                self._icon(phone, app, (i * dock_w, dock_top, (i + 1) * dock_w, dock_top + DOCK_H))
            )
        hotseat.add(dock_cells)
        qsb_top = dock_top + DOCK_H
        qsb = Node(
            "android.widget.FrameLayout",
            (48, qsb_top + 10, w - 48, qsb_top + QSB_H - 10),
            resource_id=f"{pkg}:id/search_container_hotseat",
            content_desc=tr("Search"),
            clickable=True,
            focusable=True,
            role="search_bar",
            on_click=_nothing,
        ).add(
            Node(
                "android.widget.ImageView",
                (w - 300, qsb_top + 30, w - 200, qsb_top + QSB_H - 30),
                resource_id=f"{pkg}:id/mic_icon",
                content_desc=tr("Voice search"),
                clickable=True,
                focusable=True,
                on_click=_nothing,
            ),
            Node(
                "android.widget.ImageView",
                (w - 180, qsb_top + 30, w - 80, qsb_top + QSB_H - 30),
                resource_id=f"{pkg}:id/lens_icon",
                content_desc=tr("Google Lens"),
                clickable=True,
                focusable=True,
                on_click=_nothing,
            ),
        )
        handle = Node(
            "android.view.View",
            (w // 2 - 100, dock_top - 8, w // 2 + 100, dock_top),
            resource_id=f"{pkg}:id/all_apps_handle",
            content_desc=tr("Apps list"),
        )
        drag.add(workspace, indicator, hotseat, qsb, handle)
        return [drag]


def _launch(phone: PhoneApi, package: str) -> None:
    phone.launch(package)


def _nothing() -> None:
    """Long-pressing an icon opens shortcuts on a real launcher; here it does nothing (nor do
    the search bar and the glance widget, which open apps this phone does not have)."""
