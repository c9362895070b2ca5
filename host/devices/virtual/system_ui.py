"""The windows the system puts around and over apps: status bar, navigation bar, notification
shade with quick settings, lock screen, and the dialogs that interrupt any flow (a runtime
permission prompt, "… isn't responding").

Each builder returns a finalized-ready `Node` tree laid out in screen pixels, with the ids,
classes and descriptions real SDK 34 system windows report (`com.android.systemui`,
`com.android.permissioncontroller`, `android`), so a dump of the virtual phone with a dialog or
the shade up looks like one from a real phone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from host.devices.virtual.layout import Action, Node
from host.devices.virtual.state import PhoneState
from host.devices.virtual.strings import Strings
from host.devices.virtual.widgets import NAV_BAR_H, STATUS_BAR_H, Geometry, button, text

SYSTEM_UI = "com.android.systemui"
PERMISSION_CONTROLLER = "com.android.permissioncontroller"
CLOCK_TEXT = "12:30"
#: Quick settings tiles: (label, the setting it toggles, what its second line says when on).
TILES: list[tuple[str, str, str]] = [
    ("Internet", "wifi", "HomeNetwork"),
    ("Bluetooth", "bluetooth", "On"),
    ("Do Not Disturb", "do_not_disturb", "On"),
    ("Auto-rotate", "auto_rotate", "On"),
    ("Airplane mode", "airplane_mode", "On"),
    ("Dark theme", "dark_theme", "On"),
    ("Battery Saver", "battery_saver", "On"),
    ("Location", "location", "On"),
]
QUICK_TILES = 4
PERMISSION_TEXT = {
    "android.permission.POST_NOTIFICATIONS": "Allow {0} to send you notifications?",
    "android.permission.READ_CONTACTS": "Allow {0} to access your contacts?",
    "android.permission.ACCESS_FINE_LOCATION": "Allow {0} to access this device’s location?",
}


@dataclass
class Prompt:
    """A dialog over everything: a permission prompt or an "isn't responding" dialog."""

    kind: Literal["permission", "anr"]
    #: The app the dialog is about (the one asking, or the one not responding).
    app_package: str
    app_label: str
    permission: str = ""
    #: Callbacks by answer ("allow", "deny" / "close", "wait"), set by the phone.
    answers: dict[str, Action] = field(default_factory=dict)
    #: Who shows a permission prompt (MIUI: "com.lbe.security.miui").
    permission_package: str = PERMISSION_CONTROLLER

    @property
    def package(self) -> str:
        """The package of the dialog's window."""
        return self.permission_package if self.kind == "permission" else "android"


def status_bar(geo: Geometry, state: PhoneState, strings: Strings) -> Node:
    tr = strings.tr
    w = geo.width
    frame = (0, 0, w, STATUS_BAR_H)
    bar = Node(
        "android.widget.FrameLayout",
        frame,
        resource_id=f"{SYSTEM_UI}:id/status_bar_container",
        role="status_bar",
    )
    contents = Node(
        "android.widget.LinearLayout", frame, resource_id=f"{SYSTEM_UI}:id/status_bar_contents"
    )
    start = Node(
        "android.widget.FrameLayout",
        (0, 0, w // 2, STATUS_BAR_H),
        resource_id=f"{SYSTEM_UI}:id/status_bar_start_side_container",
    ).add(
        text((48, 0, 200, STATUS_BAR_H), CLOCK_TEXT, rid=f"{SYSTEM_UI}:id/clock", size=40),
        Node(
            "android.widget.FrameLayout",
            (210, 0, 400, STATUS_BAR_H),
            resource_id=f"{SYSTEM_UI}:id/notification_icon_area",
        ).add(
            Node(
                "android.widget.ImageView",
                (220, 24, 268, 72),
                content_desc=tr("Android System")
                + " "
                + tr("Notifications").lower()
                + ": "
                + tr("USB debugging connected"),
                role="status_icon",
                glyph="o",
            )
        ),
    )
    icons = Node(
        "android.widget.LinearLayout",
        (w // 2, 0, w - 48, STATUS_BAR_H),
        resource_id=f"{SYSTEM_UI}:id/system_icons",
    )
    x = w // 2 + 80
    if state.flag("airplane_mode"):
        icons.add(
            Node(
                "android.widget.ImageView",
                (x, 24, x + 48, 72),
                resource_id=f"{SYSTEM_UI}:id/airplane",
                content_desc=tr("Airplane mode."),
                role="status_icon",
                glyph="A",
            )
        )
    else:
        wifi = tr("Wifi signal full.") if state.flag("wifi") else tr("No internet.")
        icons.add(
            Node(
                "android.widget.ImageView",
                (x, 24, x + 48, 72),
                resource_id=f"{SYSTEM_UI}:id/wifi_signal",
                content_desc=wifi,
                role="status_icon",
                glyph="w" if state.flag("wifi") else "",
            ),
            Node(
                "android.widget.ImageView",
                (x + 64, 24, x + 112, 72),
                resource_id=f"{SYSTEM_UI}:id/mobile_signal",
                content_desc=tr("Phone signal full."),
                role="status_icon",
                glyph="^",
            ),
        )
    battery = Node(
        "android.widget.LinearLayout",
        (w - 260, 0, w - 48, STATUS_BAR_H),
        resource_id=f"{SYSTEM_UI}:id/battery",
        content_desc=tr("Battery {0} percent.", state.battery_level),
    )
    if state.flag("battery_percentage"):
        battery.add(
            text(
                (w - 260, 0, w - 48, STATUS_BAR_H),
                f"{state.battery_level}%",
                rid=f"{SYSTEM_UI}:id/battery_percentage_view",
                size=40,
                align="right",
            )
        )
    icons.add(battery)
    return bar.add(contents.add(start, icons))


def navigation_bar(geo: Geometry, strings: Strings, back: Action, home: Action) -> Node:
    tr = strings.tr
    w, h = geo.width, geo.height
    top = h - NAV_BAR_H
    frame = (0, top, w, h)

    def key(i: int, rid: str, desc: str, glyph: str, action: Action | None) -> Node:
        cx = w * (2 * i + 1) // 6
        return Node(
            "android.widget.ImageView",
            (cx - 120, top, cx + 120, h),
            resource_id=f"{SYSTEM_UI}:id/{rid}",
            content_desc=tr(desc),
            clickable=True,
            focusable=True,
            long_clickable=rid == "home",
            role="nav_button",
            glyph=glyph,
            on_click=action,
        )

    buttons = Node(
        "android.widget.LinearLayout", frame, resource_id=f"{SYSTEM_UI}:id/ends_group"
    ).add(
        key(0, "back", "Back", "back", back),
        key(1, "home", "Home", "home", home),
        key(2, "recent_apps", "Overview", "recents", lambda: None),
    )
    return Node(
        "android.widget.FrameLayout",
        frame,
        resource_id=f"{SYSTEM_UI}:id/navigation_bar_frame",
        role="navigation_bar",
    ).add(
        Node(
            "android.widget.FrameLayout", frame, resource_id=f"{SYSTEM_UI}:id/navigation_inflater"
        ).add(buttons)
    )


def _tile(
    frame: tuple[int, int, int, int], label: str, on: bool, second: str, action: Action
) -> Node:
    x1, y1, x2, y2 = frame
    tile = Node(
        "android.widget.Switch",
        frame,
        content_desc=label,
        checkable=True,
        checked=on,
        clickable=True,
        focusable=True,
        long_clickable=True,
        role="tile",
        on_click=action,
    )
    return tile.add(
        Node(
            "android.widget.ImageView",
            (x1 + 32, y1 + (y2 - y1) // 2 - 36, x1 + 104, y1 + (y2 - y1) // 2 + 36),
            resource_id=f"{SYSTEM_UI}:id/icon",
            role="tile_icon",
            glyph=label[:1],
            checked=on,
        ),
        text(
            (x1 + 128, y1 + 24, x2 - 16, y1 + (y2 - y1) // 2 + 4),
            label,
            rid=f"{SYSTEM_UI}:id/tile_label",
            size=38,
        ),
        text(
            (x1 + 128, y1 + (y2 - y1) // 2 + 4, x2 - 16, y2 - 24),
            second,
            rid=f"{SYSTEM_UI}:id/app_label",
            size=34,
            role="secondary",
        ),
    )


def notification_shade(
    geo: Geometry,
    state: PhoneState,
    strings: Strings,
    *,
    expanded: bool,
    toggle: Callable[[str], Action],
    open_settings: Action,
) -> Node:
    """The shade pulled down: quick settings tiles (four, or all when `expanded`) and the
    notification list."""
    tr = strings.tr
    w, h = geo.width, geo.height
    full = (0, 0, w, h)
    panel = Node(
        "android.widget.FrameLayout",
        full,
        resource_id=f"{SYSTEM_UI}:id/notification_panel",
        role="shade",
    )
    qs = Node("android.widget.FrameLayout", (0, 0, w, 0), resource_id=f"{SYSTEM_UI}:id/qs_frame")
    header = Node(
        "android.view.ViewGroup", (0, 0, w, 200), resource_id=f"{SYSTEM_UI}:id/header"
    ).add(
        text((48, 20, 300, 120), CLOCK_TEXT, rid=f"{SYSTEM_UI}:id/clock", size=56),
        text((48, 120, 500, 190), tr("Sunday, Nov 29"), rid=f"{SYSTEM_UI}:id/date", size=36),
        Node(
            "android.widget.ImageView",
            (w - 300, 60, w - 200, 160),
            resource_id=f"{SYSTEM_UI}:id/settings_button_container",
            content_desc=tr("Open settings"),
            clickable=True,
            focusable=True,
            role="icon",
            glyph="S",
            on_click=open_settings,
        ),
        Node(
            "android.widget.ImageView",
            (w - 180, 60, w - 80, 160),
            resource_id=f"{SYSTEM_UI}:id/pm_lite",
            content_desc=tr("Power menu"),
            clickable=True,
            focusable=True,
            role="icon",
            glyph="P",
            on_click=lambda: None,
        ),
    )
    tiles = TILES if expanded else TILES[:QUICK_TILES]
    grid = Node(
        "android.view.ViewGroup",
        (0, 220, w, 220),
        resource_id=f"{SYSTEM_UI}:id/quick_settings_panel",
    )
    tile_w, tile_h = (w - 3 * 32) // 2, 170
    y = 220
    for i, (label, key, second_on) in enumerate(tiles):
        col = i % 2
        if i and col == 0:
            y += tile_h + 24
        x = 32 + col * (tile_w + 32)
        on = state.flag(key)
        second = tr(second_on) if on else tr("Off")
        grid.add(_tile((x, y, x + tile_w, y + tile_h), tr(label), on, second, toggle(key)))
    qs_bottom = y + tile_h + 32
    grid.frame = (0, 220, w, qs_bottom)
    qs.frame = (0, 0, w, qs_bottom)
    qs.add(header, grid)
    panel.add(qs)
    if not expanded:
        stack = Node(
            "android.view.ViewGroup",
            (0, qs_bottom, w, h - NAV_BAR_H),
            resource_id=f"{SYSTEM_UI}:id/notification_stack_scroller",
            scrollable=False,
        )
        row_top = qs_bottom + 24
        stack.add(
            Node(
                "android.widget.FrameLayout",
                (32, row_top, w - 32, row_top + 220),
                resource_id=f"{SYSTEM_UI}:id/expandableNotificationRow",
                content_desc=tr("Android System")
                + " "
                + tr("Notifications").lower()
                + ": "
                + tr("USB debugging connected"),
                clickable=True,
                focusable=True,
                role="card",
                on_click=lambda: None,
            ).add(
                text(
                    (80, row_top + 24, w - 80, row_top + 80),
                    tr("Android System"),
                    size=32,
                    role="secondary",
                ),
                text(
                    (80, row_top + 80, w - 80, row_top + 140),
                    tr("USB debugging connected"),
                    size=42,
                ),
                text(
                    (80, row_top + 140, w - 80, row_top + 196),
                    tr("Tap to turn off USB debugging"),
                    size=34,
                    role="secondary",
                ),
            ),
            button(
                (32, row_top + 260, 300, row_top + 360),
                tr("Manage"),
                f"{SYSTEM_UI}:id/manage_text",
                open_settings,
                role="text_button",
                font_size=38,
            ),
        )
        panel.add(stack)
    return panel


def lock_screen(geo: Geometry, strings: Strings, *, bouncer: bool) -> Node:
    """The keyguard: clock and hint, or (after a swipe on a secure lock) the PIN bouncer."""
    tr = strings.tr
    w, h = geo.width, geo.height
    root = Node(
        "android.widget.FrameLayout",
        (0, 0, w, h),
        resource_id=f"{SYSTEM_UI}:id/notification_panel",
        role="keyguard",
    )
    if not bouncer:
        return root.add(
            Node(
                "android.widget.FrameLayout",
                (0, 300, w, 800),
                resource_id=f"{SYSTEM_UI}:id/keyguard_status_view",
            ).add(
                text(
                    (0, 300, w, 600),
                    CLOCK_TEXT,
                    rid=f"{SYSTEM_UI}:id/lockscreen_clock_view",
                    size=160,
                    align="center",
                    role="on_wallpaper",
                ),
                text(
                    (0, 620, w, 700),
                    tr("Sunday, Nov 29"),
                    rid=f"{SYSTEM_UI}:id/date_view",
                    size=44,
                    align="center",
                    role="on_wallpaper",
                ),
            ),
            Node(
                "android.widget.ImageView",
                (w // 2 - 60, h - 520, w // 2 + 60, h - 400),
                resource_id=f"{SYSTEM_UI}:id/lock_icon",
                content_desc=tr("Unlock"),
                role="icon",
                glyph="L",
            ),
            text(
                (0, h - 380, w, h - 300),
                tr("Swipe up to unlock"),
                rid=f"{SYSTEM_UI}:id/keyguard_indication_text",
                size=40,
                align="center",
                role="on_wallpaper",
            ),
        )
    pad = Node(
        "android.widget.LinearLayout",
        (0, 600, w, h - 200),
        resource_id=f"{SYSTEM_UI}:id/keyguard_pin_view",
    )
    pad.add(
        text(
            (0, 620, w, 720),
            tr("Enter PIN"),
            rid=f"{SYSTEM_UI}:id/keyguard_message_area",
            size=48,
            align="center",
            role="on_wallpaper",
        ),
        Node(
            "android.widget.EditText",
            (200, 760, w - 200, 880),
            resource_id=f"{SYSTEM_UI}:id/pinEntry",
            content_desc="PIN area",
            focusable=True,
            password=True,
            role="edit",
        ),
    )
    keys = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "", "0", ""]
    kw, kh = w // 3, 200
    for i, digit in enumerate(keys):
        if not digit:
            continue
        r, c = divmod(i, 3)
        y = 960 + r * kh
        pad.add(
            Node(
                "android.view.ViewGroup",
                (c * kw, y, (c + 1) * kw, y + kh),
                resource_id=f"{SYSTEM_UI}:id/key{digit}",
                text=digit,
                clickable=True,
                focusable=True,
                role="key",
                font_size=72,
                align="center",
                on_click=lambda: None,
            )
        )
    pad.add(
        button(
            (48, h - 330, 400, h - 230),
            tr("Emergency call"),
            f"{SYSTEM_UI}:id/emergency_call_button",
            lambda: None,
            role="text_button",
            font_size=40,
        )
    )
    return root.add(pad)


def prompt_window(geo: Geometry, prompt: Prompt, strings: Strings) -> Node:
    """The dialog of a `Prompt`, centred, as the permission controller or the system shows it."""
    tr = strings.tr
    w, h = geo.width, geo.height
    x1, x2 = 72, w - 72
    if prompt.kind == "permission":
        message = tr(PERMISSION_TEXT.get(prompt.permission, "Allow {0}?"), prompt.app_label)
        y1, y2 = h // 2 - 420, h // 2 + 360
        pc = prompt.package
        body = Node(
            "android.widget.LinearLayout", (x1, y1, x2, y2), resource_id=f"{pc}:id/grant_singleton"
        )
        content = Node(
            "android.widget.LinearLayout",
            (x1, y1, x2, y1 + 420),
            resource_id=f"{pc}:id/content_container",
        ).add(
            Node(
                "android.widget.ImageView",
                (w // 2 - 48, y1 + 60, w // 2 + 48, y1 + 156),
                resource_id=f"{pc}:id/permission_icon",
                role="icon",
                glyph="!",
            ),
            text(
                (x1 + 60, y1 + 190, x2 - 60, y1 + 380),
                message,
                rid=f"{pc}:id/permission_message",
                size=48,
                align="center",
            ),
        )
        buttons = Node(
            "android.widget.LinearLayout",
            (x1, y1 + 440, x2, y2 - 40),
            resource_id=f"{pc}:id/grant_buttons_container",
        ).add(
            button(
                (x1 + 48, y1 + 460, x2 - 48, y1 + 580),
                tr("Allow"),
                f"{pc}:id/permission_allow_button",
                prompt.answers.get("allow"),
                role="pill",
                font_size=44,
            ),
            button(
                (x1 + 48, y1 + 600, x2 - 48, y1 + 720),
                tr("Don’t allow"),
                f"{pc}:id/permission_deny_button",
                prompt.answers.get("deny"),
                role="pill",
                font_size=44,
            ),
        )
        return Node("android.widget.FrameLayout", (x1, y1, x2, y2), role="dialog").add(
            body.add(content, buttons)
        )
    title = tr("{0} isn't responding", prompt.app_label)
    y1, y2 = h // 2 - 300, h // 2 + 300
    panel = Node(
        "android.widget.LinearLayout", (x1, y1, x2, y2), resource_id="android:id/parentPanel"
    )
    panel.add(
        Node(
            "android.widget.LinearLayout", (x1, y1, x2, y1 + 240), resource_id="android:id/topPanel"
        ).add(
            text((x1 + 60, y1 + 60, x2 - 60, y1 + 220), title, rid="android:id/alertTitle", size=50)
        ),
        Node(
            "android.widget.FrameLayout",
            (x1, y1 + 260, x2, y2 - 40),
            resource_id="android:id/customPanel",
        ).add(
            button(
                (x1 + 48, y1 + 280, x2 - 48, y1 + 400),
                tr("Close app"),
                "android:id/aerr_close",
                prompt.answers.get("close"),
                role="text_button",
                font_size=44,
                align="left",
            ),
            button(
                (x1 + 48, y1 + 420, x2 - 48, y1 + 540),
                tr("Wait"),
                "android:id/aerr_wait",
                prompt.answers.get("wait"),
                role="text_button",
                font_size=44,
                align="left",
            ),
        ),
    )
    return Node("android.widget.FrameLayout", (x1, y1, x2, y2), role="dialog").add(panel)
