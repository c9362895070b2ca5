"""Contacts: a list of people, a detail page, and a create-contact form with Save."""

from __future__ import annotations

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Contact, Page
from host.devices.virtual.widgets import (
    PAD,
    TOOLBAR_H,
    Geometry,
    RowFactory,
    fab,
    form_fields,
    header_row,
    scroll_list,
    text,
    toolbar,
    two_line_row,
)

PKG = "com.android.contacts"
FIELDS = [("name", "Name"), ("phone", "Phone")]


class ContactsApp(App):
    package = PKG
    label = "Contacts"
    activity = "com.android.contacts.activities.PeopleActivity"
    icon_color = (25, 103, 210)

    def activity_for(self, page: Page) -> str:
        if page.name == "editor":
            return "com.android.contacts.activities.ContactEditorActivity"
        if page.name == "detail":
            return "com.android.contacts.activities.QuickContactActivity"
        return self.activity

    def page_for_activity(self, activity: str) -> Page | None:
        if activity.endswith("ContactEditorActivity"):
            return Page("editor")
        return super().page_for_activity(activity)

    def field_order(self, page: Page) -> list[str]:
        return [key for key, _ in FIELDS] if page.name == "editor" else []

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        if page.name == "editor":
            return self._editor(phone, page, geo)
        if page.name == "detail":
            return self._detail(phone, page, geo)
        return self._list(phone, page, geo)

    def keyboard_on_open(self, page: Page) -> bool:
        return page.name == "editor"

    def _list(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width
        contacts = sorted(phone.state.contacts, key=lambda c: c.name.lower())
        bar = toolbar(PKG, geo, tr("Contacts"), None)
        bar.add(
            Node(
                "android.widget.ImageButton",
                (w - 160, geo.top + 16, w - 16, geo.top + TOOLBAR_H - 16),
                resource_id=f"{PKG}:id/menu_search",
                content_desc=tr("Search contacts"),
                clickable=True,
                focusable=True,
                role="icon",
                glyph="?",
            )
        )
        rect = (0, geo.top + TOOLBAR_H, w, geo.bottom)
        nodes: list[Node] = [bar]
        if contacts:
            rows: list[RowFactory] = []
            letter = ""
            for contact in contacts:
                initial = contact.name[:1].upper()
                if initial != letter:
                    letter = initial
                    rows.append(header_row(w, initial))

                def open_detail(name: str = contact.name) -> None:
                    phone.push("detail", name=name)

                rows.append(
                    two_line_row(
                        w, contact.name, "", open_detail, icon=contact.name[:1], package=PKG
                    )
                )
            nodes.append(scroll_list(PKG, "contact_list", rect, rows, page.scroll.get("list", 0)))
        else:
            nodes.append(
                text(
                    (PAD, rect[1] + 200, w - PAD, rect[1] + 320),
                    tr("No contacts yet"),
                    rid=f"{PKG}:id/empty",
                    align="center",
                    role="secondary",
                )
            )
        nodes.append(
            fab(
                (w - 252, geo.bottom - 252, w - 56, geo.bottom - 56),
                tr("Create contact"),
                f"{PKG}:id/floating_action_button",
                lambda: phone.push("editor"),
            )
        )
        return nodes

    def _editor(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width

        def save() -> None:
            name = page.fields.get("name", "").strip()
            number = page.fields.get("phone", "").strip()
            if not name:
                page.error = tr("Enter a name to save this contact")
                return
            phone.state.contacts.append(Contact(name=name, phone=number))
            phone.replace("detail", name=name)

        bar = toolbar(
            PKG,
            geo,
            tr("Create contact"),
            phone.pop,
            [(tr("Save"), "editor_menu_save_button", save)],
            up_label=tr("Navigate up"),
        )
        nodes: list[Node] = [bar]
        y = geo.top + TOOLBAR_H + 64
        fields = [(key, tr(hint)) for key, hint in FIELDS]
        editors, y = form_fields(page, PKG, fields, y, w)
        nodes += editors
        return nodes

    def _detail(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width
        name = page.params.get("name", "")
        contact = next((c for c in phone.state.contacts if c.name == name), None)

        def delete() -> None:
            if contact is not None and contact in phone.state.contacts:
                phone.state.contacts.remove(contact)
            phone.pop()

        bar = toolbar(
            PKG,
            geo,
            name,
            phone.pop,
            [(tr("Delete"), "menu_delete", delete)],
            up_label=tr("Navigate up"),
        )
        rect = (0, geo.top + TOOLBAR_H, w, geo.bottom)
        number = contact.phone if contact else ""
        rows = [
            two_line_row(
                w, number or tr("No phone number"), tr("Mobile"), None, icon="#", package=PKG
            )
        ]
        return [bar, scroll_list(PKG, "detail_list", rect, rows, 0)]
