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

    def _list(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        w = geo.width
        contacts = sorted(phone.state.contacts, key=lambda c: c.name.lower())
        bar = toolbar(PKG, geo, "Contacts", None)
        rect = (0, geo.top + TOOLBAR_H, w, geo.bottom)
        nodes: list[Node] = [bar]
        if contacts:
            rows: list[RowFactory] = []
            for contact in contacts:

                def open_detail(name: str = contact.name) -> None:
                    phone.push("detail", name=name)

                rows.append(two_line_row(w, contact.name, "", open_detail, icon=contact.name[:1]))
            nodes.append(scroll_list(PKG, "contact_list", rect, rows, page.scroll.get("list", 0)))
        else:
            nodes.append(
                text(
                    (PAD, rect[1] + 200, w - PAD, rect[1] + 320),
                    "No contacts yet",
                    rid=f"{PKG}:id/empty",
                    align="center",
                    role="secondary",
                )
            )
        nodes.append(
            fab(
                (w - 252, geo.bottom - 252, w - 56, geo.bottom - 56),
                "Create contact",
                f"{PKG}:id/floating_action_button",
                lambda: phone.push("editor"),
            )
        )
        return nodes

    def _editor(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        w = geo.width

        def save() -> None:
            name = page.fields.get("name", "").strip()
            number = page.fields.get("phone", "").strip()
            if not name:
                page.error = "Enter a name to save this contact"
                return
            phone.state.contacts.append(Contact(name=name, phone=number))
            phone.replace("detail", name=name)

        bar = toolbar(
            PKG, geo, "Create contact", phone.pop, [("Save", "editor_menu_save_button", save)]
        )
        nodes: list[Node] = [bar]
        y = geo.top + TOOLBAR_H + 64
        fields, y = form_fields(page, PKG, FIELDS, y, w)
        nodes += fields
        return nodes

    def _detail(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        w = geo.width
        name = page.params.get("name", "")
        contact = next((c for c in phone.state.contacts if c.name == name), None)

        def delete() -> None:
            if contact is not None and contact in phone.state.contacts:
                phone.state.contacts.remove(contact)
            phone.pop()

        bar = toolbar(PKG, geo, name, phone.pop, [("Delete", "menu_delete", delete)])
        rect = (0, geo.top + TOOLBAR_H, w, geo.bottom)
        number = contact.phone if contact else ""
        rows = [two_line_row(w, number or "No phone number", "Mobile", None, icon="#")]
        return [bar, scroll_list(PKG, "detail_list", rect, rows, 0)]
