"""Clock: an alarm list with on/off switches, an add-alarm form, and the other tabs."""

from __future__ import annotations

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Alarm, Page
from host.devices.virtual.widgets import (
    PAD,
    TOOLBAR_H,
    Geometry,
    RowFactory,
    button,
    fab,
    form_fields,
    scroll_list,
    text,
    toolbar,
)

PKG = "com.android.deskclock"
TABS = ["Alarm", "Clock", "Timer", "Stopwatch"]
TAB_H = 180
ALARM_ROW_H = 240
FIELDS = [("hour", "Hour (0-23)"), ("minute", "Minute (0-59)"), ("label", "Label")]


class ClockApp(App):
    package = PKG
    label = "Clock"
    activity = "com.android.deskclock.DeskClock"
    icon_color = (11, 87, 208)

    def activity_for(self, page: Page) -> str:
        if page.name == "add_alarm":
            return "com.android.deskclock.alarms.AlarmEditActivity"
        return self.activity

    def field_order(self, page: Page) -> list[str]:
        return [key for key, _ in FIELDS] if page.name == "add_alarm" else []

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        if page.name == "add_alarm":
            return self._editor(phone, page, geo)
        return self._tabs(phone, page, geo)

    def _tabs(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        w = geo.width
        tab = page.params.get("tab", "Alarm")
        nodes: list[Node] = [toolbar(PKG, geo, tab, None)]
        body = (0, geo.top + TOOLBAR_H, w, geo.bottom - TAB_H)
        if tab == "Alarm":
            alarms = sorted(phone.state.alarms, key=lambda a: (a.hour, a.minute))
            if alarms:
                rows = [self._alarm_row(phone, w, alarm) for alarm in alarms]
                nodes.append(
                    scroll_list(PKG, "alarm_recycler_view", body, rows, page.scroll.get("list", 0))
                )
            else:
                nodes.append(
                    text(
                        (PAD, body[1] + 200, w - PAD, body[1] + 320),
                        "No alarms",
                        align="center",
                        role="secondary",
                    )
                )
            nodes.append(
                fab(
                    (w // 2 - 98, body[3] - 240, w // 2 + 98, body[3] - 44),
                    "Add alarm",
                    f"{PKG}:id/fab",
                    lambda: phone.push("add_alarm"),
                )
            )
        else:
            big = {"Clock": "12:30", "Timer": "00:00:00", "Stopwatch": "00:00.00"}[tab]
            nodes.append(text((0, body[1] + 300, w, body[1] + 500), big, size=120, align="center"))
        bar = Node(
            "android.widget.LinearLayout", (0, body[3], w, geo.bottom), resource_id=f"{PKG}:id/tabs"
        )
        tw = w // len(TABS)
        for i, name in enumerate(TABS):

            def pick(n: str = name) -> None:
                page.params["tab"] = n

            cell = text(
                (i * tw, body[3], (i + 1) * tw, geo.bottom),
                name,
                size=40,
                align="center",
                desc=name,
            )
            cell.clickable = cell.focusable = True
            cell.selected = name == tab
            cell.on_click = pick
            cell.role = "tab"
            bar.add(cell)
        nodes.append(bar)
        return nodes

    def _alarm_row(self, phone: PhoneApi, w: int, alarm: Alarm) -> RowFactory:
        def build(y: int) -> Node:
            row = Node("android.view.ViewGroup", (0, y, w, y + ALARM_ROW_H), role="row")
            row.add(
                text(
                    (PAD, y + 24, w - 400, y + 160),
                    alarm.time_text,
                    rid=f"{PKG}:id/digital_clock",
                    size=96,
                )
            )
            label = alarm.label or "Alarm"
            row.add(
                text(
                    (PAD, y + 160, w - 400, y + 224),
                    label,
                    rid=f"{PKG}:id/label",
                    size=40,
                    role="secondary",
                )
            )

            def toggle() -> None:
                alarm.enabled = not alarm.enabled

            def delete() -> None:
                if alarm in phone.state.alarms:
                    phone.state.alarms.remove(alarm)

            row.add(
                Node(
                    "android.widget.Switch",
                    (w - 360, y + 80, w - 200, y + 160),
                    text="ON" if alarm.enabled else "OFF",
                    resource_id=f"{PKG}:id/onoff",
                    content_desc=f"{alarm.time_text} alarm",
                    checkable=True,
                    checked=alarm.enabled,
                    clickable=True,
                    focusable=True,
                    role="switch",
                    on_click=toggle,
                ),
                Node(
                    "android.widget.ImageButton",
                    (w - 168, y + 64, w - 48, y + 176),
                    resource_id=f"{PKG}:id/delete",
                    content_desc=f"Delete {alarm.time_text} alarm",
                    clickable=True,
                    focusable=True,
                    role="delete",
                    on_click=delete,
                ),
            )
            return row

        return build

    def _editor(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        w = geo.width

        def save() -> None:
            hour_s = page.fields.get("hour", "").strip()
            minute_s = page.fields.get("minute", "").strip() or "0"
            if not (hour_s.isdigit() and minute_s.isdigit()):
                page.error = "Enter the hour and minute as numbers"
                return
            hour, minute = int(hour_s), int(minute_s)
            if not (0 <= hour <= 23 and 0 <= minute <= 59):
                page.error = "Hour must be 0-23 and minute 0-59"
                return
            label = page.fields.get("label", "").strip()
            phone.state.alarms.append(Alarm(hour=hour, minute=minute, enabled=True, label=label))
            phone.pop()

        nodes: list[Node] = [toolbar(PKG, geo, "Add alarm", phone.pop)]
        y = geo.top + TOOLBAR_H + 64
        fields, y = form_fields(page, PKG, FIELDS, y, w)
        nodes += fields
        y += 140
        half = (w - 3 * PAD) // 2
        nodes.append(
            button(
                (PAD, y, PAD + half, y + 150),
                "Cancel",
                f"{PKG}:id/cancel",
                phone.pop,
                role="text_button",
            )
        )
        nodes.append(button((2 * PAD + half, y, w - PAD, y + 150), "OK", f"{PKG}:id/ok", save))
        return nodes
