"""Notes: a Jetpack Compose app. Its tree has no resource ids (Compose exports none unless the
app opts in), its views are `android.view.View`s with a role's class where one applies
(`android.widget.Button`, `android.widget.EditText`), and the editor's Save button sits at the
bottom of the screen, where the keyboard covers it while a field is being edited."""

from __future__ import annotations

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Action, Node
from host.devices.virtual.state import Note, Page
from host.devices.virtual.widgets import (
    PAD,
    TOOLBAR_H,
    Geometry,
    RowFactory,
    edit_text,
    scroll_list,
    text,
)

PKG = "com.amc.notes"
ROW_H = 220


def _button(
    frame: tuple[int, int, int, int],
    label: str,
    action: Action,
    *,
    desc: str = "",
    role: str = "button",
) -> Node:
    """A Compose button: Role.Button gives it the Button class; its text is merged in."""
    return Node(
        "android.widget.Button",
        frame,
        text=label,
        content_desc=desc,
        clickable=True,
        focusable=True,
        role=role,
        font_size=46,
        align="center",
        on_click=action,
    )


class NotesApp(App):
    package = PKG
    label = "Notes"
    activity = "com.amc.notes.MainActivity"
    icon_color = (251, 188, 4)

    def compose(self) -> bool:
        return True

    def activity_for(self, page: Page) -> str:
        return self.activity

    def field_order(self, page: Page) -> list[str]:
        return ["title", "body"] if page.name == "editor" else []

    def keyboard_on_open(self, page: Page) -> bool:
        return page.name == "editor"

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        if page.name == "editor":
            return self._editor(phone, page, geo)
        return self._list(phone, page, geo)

    def _list(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width
        top = geo.top
        nodes: list[Node] = [
            text((PAD, top, w - 200, top + TOOLBAR_H), tr("Notes"), size=60, role="title"),
            _button(
                (w - 176, top + 16, w - 16, top + TOOLBAR_H - 16),
                "",
                lambda: None,
                desc=tr("Search notes"),
                role="icon_button",
            ),
        ]
        rect = (0, top + TOOLBAR_H, w, geo.bottom)
        if phone.state.notes:
            rows: list[RowFactory] = []
            for note in phone.state.notes:

                def row(y: int, note: Note = note) -> Node:
                    item = Node(
                        "android.view.View",
                        (PAD, y + 16, w - PAD, y + ROW_H - 16),
                        clickable=True,
                        focusable=True,
                        role="card",
                    )
                    item.on_click = lambda: None
                    item.add(
                        text((PAD + 32, y + 32, w - PAD - 32, y + 112), note.title, size=50),
                        text(
                            (PAD + 32, y + 112, w - PAD - 32, y + ROW_H - 40),
                            note.body,
                            size=40,
                            role="secondary",
                        ),
                    )
                    return item

                rows.append(row)
            lst = scroll_list(PKG, "", rect, rows, page.scroll.get("list", 0))
            lst.cls = "android.view.View"
            lst.resource_id = ""
            nodes.append(lst)
        else:
            nodes.append(
                text(
                    (PAD, rect[1] + 200, w - PAD, rect[1] + 320),
                    tr("No notes yet"),
                    align="center",
                    role="secondary",
                )
            )
        nodes.append(
            _button(
                (w - 252, geo.bottom - 252, w - 56, geo.bottom - 56),
                "",
                lambda: phone.push("editor"),
                desc=tr("New note"),
                role="fab",
            )
        )
        return nodes

    def _editor(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        tr = phone.strings.tr
        w = geo.width
        top = geo.top

        def save() -> None:
            title = page.fields.get("title", "").strip()
            body = page.fields.get("body", "").strip()
            if title or body:
                phone.state.notes.append(Note(title=title, body=body))
                phone.show_toast(tr("Note saved"))
            phone.pop()

        def field(key: str, hint: str, frame: tuple[int, int, int, int]) -> Node:
            def focus() -> None:
                page.focus = key

            def set_text(value: str) -> None:
                page.fields[key] = value

            node = edit_text(
                frame,
                page.fields.get(key, ""),
                hint,
                "",
                focused=page.focus == key,
                on_click=focus,
                on_set_text=set_text,
            )
            return node

        nodes: list[Node] = [
            _button(
                (0, top, 160, top + TOOLBAR_H),
                "",
                phone.pop,
                desc=tr("Navigate up"),
                role="up_arrow",
            ),
            text((176, top, w - PAD, top + TOOLBAR_H), tr("New note"), size=60, role="title"),
            field(
                "title", tr("Title"), (PAD, top + TOOLBAR_H + 32, w - PAD, top + TOOLBAR_H + 192)
            ),
            field("body", tr("Note"), (PAD, top + TOOLBAR_H + 232, w - PAD, top + TOOLBAR_H + 792)),
        ]
        bottom = geo.bottom - 48
        half = (w - 3 * PAD) // 2
        nodes.append(
            Node("android.view.View", (0, bottom - 150, w, bottom)).add(
                _button(
                    (PAD, bottom - 150, PAD + half, bottom),
                    tr("Discard"),
                    phone.pop,
                    role="text_button",
                ),
                _button((2 * PAD + half, bottom - 150, w - PAD, bottom), tr("Save"), save),
            )
        )
        return nodes
