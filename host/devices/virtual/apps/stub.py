"""Apps the dock shows that this phone only pretends to have (Phone, Messages, Chrome, Camera):
they open to their name and nothing else, so tapping them is harmless and visible."""

from __future__ import annotations

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Page
from host.devices.virtual.widgets import PAD, TOOLBAR_H, Geometry, text, toolbar


class StubApp(App):
    def __init__(
        self, package: str, label: str, activity: str, color: tuple[int, int, int]
    ) -> None:
        self.package = package
        self.label = label
        self.activity = activity
        self.icon_color = color

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del page
        tr = phone.strings.tr
        top = geo.top + TOOLBAR_H
        return [
            toolbar(self.package, geo, tr(self.label), None),
            text(
                (PAD, top + 120, geo.width - PAD, top + 240),
                tr("Nothing here yet."),
                rid=f"{self.package}:id/empty",
                align="center",
                role="secondary",
            ),
        ]


def dock_apps() -> list[StubApp]:
    return [
        StubApp(
            "com.android.dialer",
            "Phone",
            "com.android.dialer.main.impl.MainActivity",
            (30, 142, 62),
        ),
        StubApp(
            "com.google.android.apps.messaging",
            "Messages",
            "com.google.android.apps.messaging.ui.ConversationListActivity",
            (26, 115, 232),
        ),
        StubApp(
            "com.android.chrome", "Chrome", "com.google.android.apps.chrome.Main", (219, 68, 55)
        ),
        StubApp(
            "com.android.camera2", "Camera", "com.android.camera.CameraLauncher", (95, 99, 104)
        ),
    ]
