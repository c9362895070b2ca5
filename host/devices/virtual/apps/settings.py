"""The Settings app: a long, scrolling top-level list and nested pages of toggles and choices."""

from __future__ import annotations

from dataclasses import dataclass

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Page
from host.devices.virtual.widgets import (
    PAD,
    TOOLBAR_H,
    Geometry,
    RowFactory,
    header_row,
    radio_row,
    scroll_list,
    switch_widget,
    text,
    toolbar,
    two_line_row,
)

PKG = "com.android.settings"


@dataclass(frozen=True)
class Entry:
    """One top-level Settings entry and the page it opens."""

    title: str
    summary: str
    page: str


MAIN_ENTRIES = [
    Entry("Network & internet", "Wi-Fi, mobile, data usage, hotspot", "network"),
    Entry("Connected devices", "Bluetooth, pairing", "connected"),
    Entry("Apps", "Recent apps, default apps", "stub"),
    Entry("Notifications", "Notification history, conversations", "stub"),
    Entry("Battery", "", "battery"),
    Entry("Storage", "37% used - 81 GB free", "stub"),
    Entry("Sound & vibration", "Volume, haptics, Do Not Disturb", "sound"),
    Entry("Display", "Dark theme, font size, brightness", "display"),
    Entry("Wallpaper & style", "Colors, themed icons, app grid", "stub"),
    Entry("Accessibility", "Display, interaction, audio", "accessibility"),
    Entry("Security & privacy", "App security, device lock", "stub"),
    Entry("Location", "", "location"),
    Entry("Safety & emergency", "Emergency SOS, medical info, alerts", "stub"),
    Entry("Passwords & accounts", "Saved passwords, autofill, accounts", "stub"),
    Entry("Digital Wellbeing", "Screen time, app timers, bedtime", "stub"),
    Entry("System", "Languages, gestures, time, backup", "system"),
    Entry("About phone", "", "about"),
    Entry("Tips & support", "Help articles, phone and chat", "stub"),
]

FONT_SIZES = ["Small", "Default", "Large", "Largest"]
SCREEN_TIMEOUTS = [
    "15 seconds",
    "30 seconds",
    "1 minute",
    "2 minutes",
    "5 minutes",
    "10 minutes",
    "30 minutes",
]
TITLES = {
    "network": "Network & internet",
    "connected": "Connected devices",
    "display": "Display",
    "font_size": "Font size",
    "screen_timeout": "Screen timeout",
    "sound": "Sound & vibration",
    "battery": "Battery",
    "location": "Location",
    "accessibility": "Accessibility",
    "system": "System",
    "date_time": "Date & time",
    "about": "About phone",
}
ACTIVITIES = {
    "com.android.settings.Settings$NetworkDashboardActivity": "network",
    "com.android.settings.Settings$WifiSettingsActivity": "network",
    "com.android.settings.Settings$ConnectedDeviceDashboardActivity": "connected",
    "com.android.settings.Settings$DisplaySettingsActivity": "display",
    "com.android.settings.Settings$SoundSettingsActivity": "sound",
    "com.android.settings.Settings$PowerUsageSummaryActivity": "battery",
    "com.android.settings.Settings$LocationSettingsActivity": "location",
    "com.android.settings.Settings$AccessibilitySettingsActivity": "accessibility",
    "com.android.settings.Settings$SystemDashboardActivity": "system",
    "com.android.settings.Settings$DateTimeSettingsActivity": "date_time",
    "com.android.settings.Settings$MyDeviceInfoActivity": "about",
}


class SettingsApp(App):
    package = PKG
    label = "Settings"
    activity = "com.android.settings.Settings"
    icon_color = (95, 99, 104)

    def __init__(self, model: str) -> None:
        self._model = model

    def activity_for(self, page: Page) -> str:
        return self.activity if page.name == "main" else "com.android.settings.SubSettings"

    def page_for_activity(self, activity: str) -> Page | None:
        full = PKG + activity if activity.startswith(".") else activity
        if full in ACTIVITIES:
            return Page(ACTIVITIES[full])
        return super().page_for_activity(activity)

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width
        title = (
            tr("Settings")
            if page.name == "main"
            else tr(TITLES.get(page.name, page.params.get("title", "")))
        )
        up = None if page.name == "main" else phone.pop
        bar = toolbar(PKG, geo, title, up, up_label=tr("Navigate up"))
        rect = (0, geo.top + TOOLBAR_H, w, geo.bottom)
        rows = self._rows(phone, page, w)
        if page.name == "stub":
            body = text(
                (PAD, rect[1] + 48, w - PAD, rect[1] + 160),
                tr("Nothing to change on this page."),
                rid=f"{PKG}:id/empty",
                size=44,
                role="secondary",
            )
            return [bar, body]
        lst = scroll_list(PKG, "recycler_view", rect, rows, page.scroll.get("list", 0))
        return [bar, lst]

    def _switch(
        self, phone: PhoneApi, w: int, title: str, key: str, summary: str = ""
    ) -> RowFactory:
        state = phone.state
        tr = phone.strings.tr

        def toggle() -> None:
            state.settings[key] = not state.flag(key)

        return two_line_row(
            w, tr(title), tr(summary), toggle, widget=switch_widget(state.flag(key))
        )

    def _link(self, phone: PhoneApi, w: int, title: str, summary: str, target: str) -> RowFactory:
        def open_page() -> None:
            phone.push(target, title=title)

        tr = phone.strings.tr
        return two_line_row(w, tr(title), tr(summary), open_page)

    def _info(self, phone: PhoneApi, w: int, title: str, summary: str) -> RowFactory:
        tr = phone.strings.tr
        return two_line_row(w, tr(title), tr(summary), None)

    def _choices(self, phone: PhoneApi, w: int, key: str, options: list[str]) -> list[RowFactory]:
        state = phone.state
        current = str(state.settings.get(key, ""))
        rows: list[RowFactory] = []
        for option in options:

            def choose(value: str = option) -> None:
                state.settings[key] = value

            rows.append(radio_row(w, phone.strings.tr(option), option == current, choose))
        return rows

    def _rows(self, phone: PhoneApi, page: Page, w: int) -> list[RowFactory]:
        s = phone.state
        tr = phone.strings.tr
        name = page.name
        if name == "main":
            rows: list[RowFactory] = [two_line_row(w, tr("Search settings"), "", None, icon="?")]
            for e in MAIN_ENTRIES:
                summary = tr(e.summary)
                if e.page == "battery":
                    summary = f"{s.battery_level}%" + (
                        tr(" - Battery Saver on") if s.flag("battery_saver") else ""
                    )
                elif e.page == "location":
                    summary = tr("On - 3 apps have access") if s.flag("location") else tr("Off")
                elif e.page == "about":
                    summary = self._model

                def open_entry(target: str = e.page, title: str = e.title) -> None:
                    phone.push(target, title=title)

                label = tr(e.title)
                rows.append(two_line_row(w, label, summary, open_entry, icon=label[:1]))
            return rows
        if name == "network":
            wifi_summary = "HomeNetwork" if s.flag("wifi") else "Off"
            return [
                self._switch(phone, w, "Wi-Fi", "wifi", wifi_summary),
                self._info(phone, w, "Mobile network", "Virtual Mobile"),
                self._switch(phone, w, "Airplane mode", "airplane_mode"),
                self._link(phone, w, "Hotspot & tethering", "Off", "stub"),
                self._switch(phone, w, "Data Saver", "data_saver"),
                self._link(phone, w, "VPN", "None", "stub"),
            ]
        if name == "connected":
            return [
                self._switch(phone, w, "Bluetooth", "bluetooth"),
                self._link(phone, w, "Pair new device", "", "stub"),
                self._link(phone, w, "Connection preferences", "NFC, Android Auto", "stub"),
            ]
        if name == "display":
            timeout = tr("After {0} of inactivity", tr(str(s.settings["screen_timeout"])))
            brightness = f"{round(int(s.settings['brightness']) * 100 / 255)}%"
            return [
                header_row(w, tr("Brightness")),
                two_line_row(w, tr("Brightness level"), brightness, None),
                self._switch(phone, w, "Adaptive brightness", "adaptive_brightness"),
                header_row(w, tr("Lock display")),
                two_line_row(
                    w,
                    tr("Screen timeout"),
                    timeout,
                    lambda: phone.push("screen_timeout", title="Screen timeout"),
                ),
                header_row(w, tr("Appearance")),
                self._switch(phone, w, "Dark theme", "dark_theme"),
                self._link(phone, w, "Font size", str(s.settings["font_size"]), "font_size"),
                self._switch(phone, w, "Auto-rotate screen", "auto_rotate"),
            ]
        if name == "font_size":
            return self._choices(phone, w, "font_size", FONT_SIZES)
        if name == "screen_timeout":
            return self._choices(phone, w, "screen_timeout", SCREEN_TIMEOUTS)
        if name == "sound":
            return [
                self._info(phone, w, "Media volume", "60%"),
                self._switch(phone, w, "Do Not Disturb", "do_not_disturb"),
                self._switch(phone, w, "Vibrate for calls", "vibrate_for_calls"),
                self._link(phone, w, "Phone ringtone", "Virtual Bells", "stub"),
            ]
        if name == "battery":
            return [
                two_line_row(w, tr("Battery level"), f"{s.battery_level}%", None),
                self._switch(phone, w, "Battery Saver", "battery_saver"),
                self._switch(phone, w, "Battery percentage", "battery_percentage"),
                self._link(phone, w, "Battery usage", "", "stub"),
            ]
        if name == "location":
            return [
                self._switch(phone, w, "Use location", "location"),
                self._link(phone, w, "Recent access", "", "stub"),
            ]
        if name == "accessibility":
            return [
                self._link(phone, w, "TalkBack", "Off", "stub"),
                self._switch(phone, w, "Color inversion", "color_inversion"),
                self._link(phone, w, "Font size", str(s.settings["font_size"]), "font_size"),
            ]
        if name == "system":
            return [
                self._link(phone, w, "Languages", "English (United States)", "stub"),
                self._link(phone, w, "Gestures", "", "stub"),
                self._link(phone, w, "Date & time", "GMT+00:00", "date_time"),
                self._link(phone, w, "Backup", "Off", "stub"),
                self._link(phone, w, "Reset options", "", "stub"),
            ]
        if name == "date_time":
            return [
                self._switch(phone, w, "Set time automatically", "auto_time"),
                self._switch(phone, w, "Use 24-hour format", "use_24_hour_format"),
            ]
        if name == "about":
            return [
                two_line_row(w, tr("Device name"), self._model, None),
                self._info(phone, w, "Phone number", "Unknown"),
                two_line_row(w, tr("Model"), self._model, None),
                self._info(phone, w, "Android version", "14"),
                self._info(phone, w, "Build number", "AMC.241129.001"),
            ]
        return []
