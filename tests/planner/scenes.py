"""Hand-built scenes shaped like the virtual phone's (rows with titles and summaries, switches
that carry ON/OFF text, EditTexts that show their hint when empty)."""

from __future__ import annotations

from planner.scene import Bounds, Element, Scene

W, H = 1080, 2400


def el(
    i: int, text: str = "", bounds: tuple[int, int, int, int] = (0, 0, 10, 10), **kw: object
) -> Element:
    # kw: any other Element field by name (the dataclass's own keyword arguments).
    return Element(element_id=f"e{i}", bounds=Bounds(*bounds), text=text, **kw)  # type: ignore[arg-type]


def launcher() -> Scene:
    apps = ["Phone", "Contacts", "Clock", "Settings", "Camera"]
    elements = [
        el(i + 1, name, (i * 216, 1800, (i + 1) * 216, 2016), clickable=True, content_desc=name)
        for i, name in enumerate(apps)
    ]
    return Scene(elements, "com.android.launcher3", "Home", W, H)


def settings_main(rows: list[tuple[str, str]] | None = None) -> Scene:
    rows = rows or [
        ("Network & internet", "Wi-Fi, mobile, data usage, hotspot"),
        ("Connected devices", "Bluetooth, pairing"),
        ("Apps", "Recent apps, default apps"),
        ("Battery", ""),
        ("Sound & vibration", "Volume, haptics, Do Not Disturb"),
        ("Display", "Dark theme, font size, brightness"),
    ]
    elements = [
        el(1, "Settings", (48, 96, 900, 272)),
        el(2, "", (0, 272, W, 2268), scrollable=True),
    ]
    y = 272
    for title, summary in rows:
        n = len(elements)
        elements.append(el(n + 1, "", (0, y, W, y + 208), clickable=True))
        elements.append(el(n + 2, title, (176, y + 30, 1000, y + 110)))
        if summary:
            elements.append(el(n + 3, summary, (176, y + 110, 1000, y + 180)))
        y += 208
    return Scene(elements, "com.android.settings", "Settings", W, H)


def toggle_page(title: str, switches: list[tuple[str, bool]]) -> Scene:
    elements = [
        el(1, "", (0, 96, 160, 272), clickable=True, content_desc="Navigate up"),
        el(2, title, (176, 96, 900, 272)),
    ]
    y = 272
    for label, on in switches:
        n = len(elements)
        elements.append(el(n + 1, "", (0, y, W, y + 176), clickable=True))
        elements.append(el(n + 2, label, (48, y + 40, 800, y + 130)))
        elements.append(
            el(
                n + 3,
                "ON" if on else "OFF",
                (880, y + 40, 1032, y + 130),
                checkable=True,
                checked=on,
                class_name="android.widget.Switch",
            )
        )
        y += 176
    return Scene(elements, "com.android.settings", title, W, H)


def contacts_list(names: tuple[str, ...] = ()) -> Scene:
    elements = [el(1, "Contacts", (48, 96, 900, 272))]
    y = 272
    for name in names:
        n = len(elements)
        elements.append(el(n + 1, "", (0, y, W, y + 176), clickable=True))
        elements.append(el(n + 2, name, (176, y + 40, 1000, y + 130)))
        y += 176
    elements.append(
        el(
            len(elements) + 1,
            "",
            (828, 2016, 1024, 2212),
            clickable=True,
            content_desc="Create contact",
        )
    )
    return Scene(elements, "com.android.contacts", "Contacts", W, H)


def contact_editor(name: str = "", phone: str = "") -> Scene:
    elements = [
        el(1, "", (0, 96, 160, 272), clickable=True, content_desc="Navigate up"),
        el(2, "Create contact", (176, 96, 700, 272)),
        el(3, "Save", (850, 132, 1056, 236), clickable=True, class_name="android.widget.Button"),
        el(
            4,
            name or "Name",
            (48, 336, 1032, 496),
            clickable=True,
            class_name="android.widget.EditText",
            resource_id="com.android.contacts:id/name",
        ),
        el(
            5,
            phone or "Phone",
            (48, 544, 1032, 704),
            clickable=True,
            class_name="android.widget.EditText",
            resource_id="com.android.contacts:id/phone",
        ),
    ]
    return Scene(elements, "com.android.contacts", "Create contact", W, H)


def contact_detail(name: str, phone: str) -> Scene:
    elements = [
        el(1, "", (0, 96, 160, 272), clickable=True, content_desc="Navigate up"),
        el(2, name, (176, 96, 700, 272)),
        el(3, "Delete", (850, 132, 1056, 236), clickable=True),
        el(4, phone, (176, 300, 1000, 380)),
        el(5, "Mobile", (176, 380, 1000, 440)),
    ]
    return Scene(elements, "com.android.contacts", name, W, H)


def login_form(password_shown: str = "") -> Scene:
    """A sign-in page: a user field, a password field (masked: it shows dots once filled, as
    Android's password fields do), and a Sign in button."""
    elements = [
        el(1, "Sign in", (48, 96, 700, 272)),
        el(
            2,
            password_shown,
            (48, 336, 1032, 496),
            clickable=True,
            class_name="android.widget.EditText",
            resource_id="com.example.app:id/password",
            password=True,
            hint="Password",
        ),
        el(3, "Sign in", (48, 544, 1032, 704), clickable=True, class_name="android.widget.Button"),
    ]
    return Scene(elements, "com.example.app", "Sign in", W, H)
