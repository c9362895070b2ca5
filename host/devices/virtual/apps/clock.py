"""Clock: an alarm list with on/off switches, an alarm editor with a time picker, and the other
tabs.

The editor is the platform's spinner TimePicker (what many vendors' clocks show): one
NumberPicker per field (hours, minutes, and AM/PM in 12-hour format), each a column of the
previous value, an editable current value and the next value. Tap the neighbours to step, swipe
the column to spin it, or tap the value and type (typing replaces it: the picker selects its
value when tapped; the value is taken when focus leaves the picker). Below it: the alarm's name
and, at the bottom of the screen, Cancel and Save, which the keyboard covers while it is up.
"""

from __future__ import annotations

from collections.abc import Callable

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Alarm, Page
from host.devices.virtual.widgets import (
    PAD,
    TOOLBAR_H,
    Geometry,
    RowFactory,
    button,
    edit_text,
    fab,
    scroll_list,
    text,
    toolbar,
)

PKG = "com.android.deskclock"
TABS = ["Alarm", "Clock", "Timer", "Stopwatch"]
TAB_H = 180
ALARM_ROW_H = 240
PICKER_ROW_H = 180
DEFAULT_TIME = (6, 0)
PICKERS = ("hour", "minute", "ampm")


def _picker_range(key: str, twelve_hour: bool) -> list[str]:
    if key == "minute":
        return [f"{m:02d}" for m in range(60)]
    if key == "ampm":
        return ["AM", "PM"]
    return [str(h) for h in range(1, 13)] if twelve_hour else [f"{h:02d}" for h in range(24)]


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
        return ["hour", "minute", "label"] if page.name == "add_alarm" else []

    def first_focus(self, page: Page) -> str | None:
        del page
        return None  # the editor opens on its picker, nothing focused, no keyboard

    def runtime_permissions(self) -> list[str]:
        return ["android.permission.POST_NOTIFICATIONS"]

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        if page.name == "add_alarm":
            return self._editor(phone, page, geo)
        return self._tabs(phone, page, geo)

    # --- the alarm list and the other tabs ----------------------------------------------------

    def _tabs(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width
        tab = page.params.get("tab", "Alarm")
        nodes: list[Node] = [toolbar(PKG, geo, tr(tab), None)]
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
                        tr("No alarms"),
                        align="center",
                        role="secondary",
                    )
                )
            nodes.append(
                fab(
                    (w // 2 - 98, body[3] - 240, w // 2 + 98, body[3] - 44),
                    tr("Add alarm"),
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
                tr(name),
                size=40,
                align="center",
                desc=tr(name),
            )
            cell.clickable = cell.focusable = True
            cell.selected = name == tab
            cell.on_click = pick
            cell.role = "tab"
            bar.add(cell)
        nodes.append(bar)
        return nodes

    def _alarm_row(self, phone: PhoneApi, w: int, alarm: Alarm) -> RowFactory:
        tr = phone.strings.tr

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
            row.add(
                text(
                    (PAD, y + 160, w - 400, y + 224),
                    alarm.label or tr("Alarm"),
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
                    content_desc=tr("{0} alarm", alarm.time_text),
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
                    content_desc=tr("Delete {0} alarm", alarm.time_text),
                    clickable=True,
                    focusable=True,
                    role="delete",
                    on_click=delete,
                ),
            )
            return row

        return build

    # --- the editor -----------------------------------------------------------------------------

    @staticmethod
    def _twelve_hour(phone: PhoneApi) -> bool:
        return not phone.state.flag("use_24_hour_format")

    def _committed(self, phone: PhoneApi, page: Page) -> dict[str, str]:
        """The picker's values as shown when no one is typing: 24-hour hour and minute."""
        hour = int(page.params.get("hour", str(DEFAULT_TIME[0])))
        minute = int(page.params.get("minute", str(DEFAULT_TIME[1])))
        if self._twelve_hour(phone):
            return {
                "hour": str(hour % 12 or 12),
                "minute": f"{minute:02d}",
                "ampm": "AM" if hour < 12 else "PM",
            }
        return {"hour": f"{hour:02d}", "minute": f"{minute:02d}"}

    def _store(self, phone: PhoneApi, page: Page, shown: dict[str, str]) -> None:
        hour, minute = int(shown["hour"]), int(shown["minute"])
        if self._twelve_hour(phone):
            hour = hour % 12 + (12 if shown.get("ampm") == "PM" else 0)
        page.params["hour"], page.params["minute"] = str(hour), str(minute)

    def _step(self, phone: PhoneApi, page: Page, key: str, steps: int) -> None:
        values = _picker_range(key, self._twelve_hour(phone))
        shown = self._committed(phone, page)
        i = values.index(shown[key]) if shown[key] in values else 0
        shown[key] = values[(i + steps) % len(values)]
        self._store(phone, page, shown)

    def settle(self, phone: PhoneApi, page: Page) -> None:
        """Take what was typed into a picker once focus has left it (a value out of range is
        dropped and the picker shows its old value, as the platform's NumberPicker does)."""
        if page.name != "add_alarm":
            return
        for key in PICKERS:
            if key == page.focus or key not in page.fields:
                continue
            typed = page.fields.pop(key).strip()
            values = _picker_range(key, self._twelve_hour(phone))
            match = next(
                (
                    v
                    for v in values
                    if v.lower() == typed.lower()
                    or (typed.isdigit() and v.isdigit() and int(v) == int(typed))
                ),
                None,
            )
            if match is not None:
                shown = self._committed(phone, page)
                shown[key] = match
                self._store(phone, page, shown)

    def _picker(self, phone: PhoneApi, page: Page, key: str, x1: int, x2: int, top: int) -> Node:
        values = _picker_range(key, self._twelve_hour(phone))
        shown = self._committed(phone, page)[key]
        i = values.index(shown) if shown in values else 0
        prev_v, next_v = values[(i - 1) % len(values)], values[(i + 1) % len(values)]
        value = page.fields.get(key, shown) if page.focus == key else shown

        def step(n: int) -> Callable[[], None]:
            return lambda: self._step(phone, page, key, n)

        def focus() -> None:
            page.focus = key
            page.fields[key] = shown
            page.select_all = True

        def spin(dy: int) -> None:
            steps = round(dy / PICKER_ROW_H)
            if steps:
                self._step(phone, page, key, steps)

        def set_value(v: str) -> None:
            page.fields[key] = v

        picker = Node(
            "android.widget.NumberPicker",
            (x1, top, x2, top + 3 * PICKER_ROW_H),
            resource_id=f"android:id/{key if key != 'ampm' else 'amPm'}",
            focusable=True,
            scrollable=True,
            long_clickable=True,
            role="picker",
        )
        picker.on_scroll = spin
        picker.add(
            button(
                (x1, top, x2, top + PICKER_ROW_H), prev_v, "", step(-1), role="picker_neighbour"
            ),
            edit_text(
                (x1, top + PICKER_ROW_H, x2, top + 2 * PICKER_ROW_H),
                value,
                "",
                "android:id/numberpicker_input",
                focused=page.focus == key,
                on_click=focus,
                on_set_text=set_value,
            ),
            button(
                (x1, top + 2 * PICKER_ROW_H, x2, top + 3 * PICKER_ROW_H),
                next_v,
                "",
                step(1),
                role="picker_neighbour",
            ),
        )
        for child in picker.children:
            child.font_size = 72
            child.align = "center"
        return picker

    def _editor(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width
        twelve = self._twelve_hour(phone)

        def save() -> None:
            page.focus = None
            self.settle(phone, page)
            hour = int(page.params.get("hour", str(DEFAULT_TIME[0])))
            minute = int(page.params.get("minute", str(DEFAULT_TIME[1])))
            label = page.fields.get("label", "").strip()
            alarm = Alarm(hour=hour, minute=minute, enabled=True, label=label)
            phone.state.alarms.append(alarm)
            phone.pop()
            phone.show_toast(tr("Alarm set for {0}", alarm.time_text))

        nodes: list[Node] = [
            toolbar(PKG, geo, tr("Add alarm"), phone.pop, up_label=tr("Navigate up"))
        ]
        top = geo.top + TOOLBAR_H + 48
        keys = ["hour", "minute"] + (["ampm"] if twelve else [])
        col = 240
        gap = 60
        total = len(keys) * col + (len(keys) - 1) * gap
        x = (w - total) // 2
        layout = Node(
            "android.widget.LinearLayout",
            (x, top, x + total, top + 3 * PICKER_ROW_H),
            resource_id="android:id/timePickerLayout",
        )
        for i, key in enumerate(keys):
            layout.add(self._picker(phone, page, key, x, x + col, top))
            x += col
            if i < len(keys) - 1:
                mid = top + PICKER_ROW_H
                sep = ":" if i == 0 else ""
                layout.add(
                    text(
                        (x, mid, x + gap, mid + PICKER_ROW_H),
                        sep,
                        rid="android:id/divider",
                        size=72,
                        align="center",
                    )
                )
                x += gap
        nodes.append(
            Node(
                "android.widget.TimePicker",
                (0, top, w, top + 3 * PICKER_ROW_H),
                resource_id="android:id/timePicker",
            ).add(layout)
        )
        y = top + 3 * PICKER_ROW_H + 80

        def focus_label() -> None:
            page.focus = "label"

        def set_label(value: str) -> None:
            page.fields["label"] = value

        nodes.append(
            edit_text(
                (PAD, y, w - PAD, y + 160),
                page.fields.get("label", ""),
                tr("Alarm name"),
                f"{PKG}:id/label_input",
                focused=page.focus == "label",
                on_click=focus_label,
                on_set_text=set_label,
            )
        )
        half = (w - 3 * PAD) // 2
        bottom = geo.bottom - 48
        bar = Node(
            "android.widget.LinearLayout",
            (0, bottom - 150, w, bottom),
            resource_id=f"{PKG}:id/bottom_bar",
        )
        bar.add(
            button(
                (PAD, bottom - 150, PAD + half, bottom),
                tr("Cancel"),
                f"{PKG}:id/cancel",
                phone.pop,
                role="text_button",
            ),
            button(
                (2 * PAD + half, bottom - 150, w - PAD, bottom), tr("Save"), f"{PKG}:id/save", save
            ),
        )
        nodes.append(bar)
        return nodes
