"""The dump forms real tools produce, parsed (fixtures: see fixtures/SOURCES.md), and the
bounds perception keeps on what reaches the prompt."""

from __future__ import annotations

from pathlib import Path

from host.devices.adb_driver import decode_dump
from host.perception.dump_text import join_surrogate_refs, repair_dump
from host.perception.hierarchy import (
    KEYBOARD_LABEL,
    MAX_ELEMENTS,
    MAX_SCENE_TEXT,
    TEXT_CAP,
    parse_scene,
)

FIXTURES = Path(__file__).parent / "fixtures"
NODE = (
    '<node index="0" text="{text}" resource-id="{rid}" class="{cls}" package="com.example" '
    'content-desc="" checkable="false" checked="false" clickable="{click}" enabled="true" '
    'focusable="false" focused="false" scrollable="false" long-clickable="false" '
    'password="false" selected="false" bounds="{b}" drawing-order="1" hint="">{kids}</node>'
)


def _node(b: str, text: str = "", cls: str = "android.widget.TextView", kids: str = "") -> str:
    return NODE.format(b=b, text=text, rid="", cls=cls, click="false", kids=kids)


def _load(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_xml_followed_by_the_dump_status_line_parses_like_the_xml() -> None:
    """`adb exec-out uiautomator dump /dev/tty`: the XML, then "UI hierchary dumped to"."""
    tty = _load("exec_out_dev_tty_settings_1080x2400.txt")
    assert tty.rstrip().endswith("UI hierchary dumped to: /dev/tty")
    scene = parse_scene(tty)
    plain = parse_scene(_load("settings_home_1080x2400.xml"))
    assert [e.to_prompt() for e in scene.elements] == [e.to_prompt() for e in plain.elements]
    assert scene.page_title == "Settings"


def test_control_characters_and_invalid_references_are_dropped() -> None:
    scene = parse_scene(_load("u2_chat_control_chars_1080x2400.xml"))
    texts = [e.text for e in scene.elements]
    assert "Yes! 10am at the market" in texts  # was "…market&#1;"
    assert "Bring the list please" in texts  # held a raw vertical tab
    assert "[0mforwarded message" in texts  # was "&#27;[0m…"
    assert all(ch >= " " or ch in "\n\t" for t in texts for ch in t)
    assert scene.package == "com.whatsapp"
    # The status and navigation bars (their own window roots) are chrome, not the app.
    assert not [e for e in scene.elements if e.package == "com.android.systemui"]
    # An empty field reports its hint as its text (Android 8+): seen as empty, with its hint.
    entry = next(e for e in scene.elements if e.resource_id == "com.whatsapp:id/entry")
    assert (entry.text, entry.hint) == ("", "Message")
    assert entry.to_prompt()["hint"] == "Message"
    assert scene.overlays == []


def test_a_utf16_declaration_over_a_utf8_body() -> None:
    raw = (FIXTURES / "utf16_declared_kakaotalk_1080x2400.xml").read_bytes()
    assert b"encoding='UTF-16'" in raw[:80]
    scene = parse_scene(decode_dump(raw))
    texts = [e.text for e in scene.elements]
    assert {"김민준", "이서연", "최수아 🌸"} <= set(texts)
    assert scene.page_title == "친구"
    descs = {e.content_desc for e in scene.elements if e.clickable}
    assert {"채팅", "더보기"} <= descs


def test_a_real_utf16_file_is_read_as_utf16() -> None:
    body = _load("permission_prompt_camera_1080x2400.xml")
    scene = parse_scene(decode_dump(body.encode("utf-16")))  # with its byte order mark
    assert scene.page_title == "Allow Camera to take pictures and record video?"


def test_windows_dump_keyboard_covers_the_lower_fields() -> None:
    """`uiautomator dump --windows`: what lies under the keyboard is out of reach."""
    scene = parse_scene(_load("windows_contacts_keyboard_1080x2400.xml"))
    assert scene.overlays == ["keyboard"]
    assert scene.package == "com.google.android.contacts"
    hints = {e.hint for e in scene.elements if e.class_name.endswith("EditText")}
    assert {"First name", "Last name", "Company"} <= hints
    assert not {"Phone", "Email"} & hints  # laid out under the keyboard
    first = next(e for e in scene.elements if e.hint == "First name")
    assert (first.text, first.focused) == ("Ada", True)
    keyboards = [e for e in scene.elements if e.content_desc == KEYBOARD_LABEL]
    assert [k.bounds.to_list() for k in keyboards] == [[0, 1446, 1080, 2274]]
    assert keyboards[0].package == "com.google.android.inputmethod.latin"
    assert not [e for e in scene.elements if e.content_desc == "q"]  # keys collapse into one
    assert not [e for e in scene.elements if e.package == "com.android.systemui"]
    assert next(e for e in scene.elements if e.text == "Save").clickable


def test_an_apps_own_dialog_hides_the_screen_under_it() -> None:
    """`uiautomator dump --windows` with an AlertDialog up: the dialog is a window of the app's
    own package over its activity, and it has the focus. A Dialog does not set
    FLAG_NOT_TOUCH_MODAL, so it takes every touch (one outside it cancels it): the activity's
    Save button, still listed, was a tap that would only have dismissed the dialog. Only
    the dialog is in reach now, as the plain `uiautomator dump` of Android 10 and earlier
    (the focused window alone) showed it."""
    scene = parse_scene(_load("windows_contacts_discard_dialog_1080x2400.xml"))
    texts = [e.text for e in scene.elements]
    assert [e.text for e in scene.elements if e.clickable] == ["Keep editing", "Discard"]
    assert "Save" not in texts and "Ada" not in texts
    assert scene.package == "com.google.android.contacts"
    assert scene.page_title == "Discard your changes?"
    # The editor alone (the dialog gone, the editor focused again) is all in reach.
    editor = parse_scene(_load("windows_contacts_keyboard_1080x2400.xml"))
    assert next(e for e in editor.elements if e.text == "Save").clickable


def test_side_by_side_panes_of_one_app_are_both_in_reach() -> None:
    """Activity embedding (Settings' two panes on a foldable or tablet) puts two windows of
    one package side by side, one of them focused: neither lies over the other, so both
    stay in reach (only a window the focused one lies within is under it)."""
    pane = (
        '<window type="TYPE_APPLICATION" layer="{layer}" bounds="{b}" active="{a}" focused="{a}">'
    )
    left = NODE.format(
        b="[0,0][1100,1840]",
        text="Network &amp; internet",
        rid="",
        cls="android.widget.TextView",
        click="true",
        kids="",
    )
    right = NODE.format(
        b="[1100,0][2208,1840]",
        text="Wi-Fi",
        rid="",
        cls="android.widget.TextView",
        click="true",
        kids="",
    )
    dump = (
        '<displays><display id="0">'
        + pane.format(layer=10, b="[0,0][1100,1840]", a="false")
        + f'<hierarchy rotation="0">{left}</hierarchy></window>'
        + pane.format(layer=11, b="[1100,0][2208,1840]", a="true")
        + f'<hierarchy rotation="0">{right}</hierarchy></window></display></displays>'
    )  # fmt: skip
    scene = parse_scene(dump, (2208, 1840), "com.example")
    assert [e.text for e in scene.elements] == ["Network & internet", "Wi-Fi"]


def test_another_apps_activity_over_the_app_hides_it_as_a_share_sheet_does() -> None:
    """Android 13+'s share sheet is an activity of `com.android.intentresolver` over the app
    that shares (translucent, the screen's size: a tap above the sheet closes it), with the
    focus. Only a focused window of the app's own package hid what lay under it, so the
    Photos buttons behind the sheet were listed as in reach, and a tap meant for Delete
    landed on a share target. Any app's focused activity hides the windows it lies within."""
    win = '<window type="TYPE_APPLICATION" layer="{layer}" bounds="{b}" active="{a}" focused="{a}">'

    def clickable(b: str, text: str, package: str) -> str:
        return NODE.format(
            b=b, text=text, rid="", cls="android.widget.Button", click="true", kids=""
        ).replace('package="com.example"', f'package="{package}"')

    photos = "com.google.android.apps.photos"
    chooser = "com.android.intentresolver"
    dump = (
        '<displays><display id="0">'
        + win.format(layer=10, b="[0,0][1080,2400]", a="false")
        + '<hierarchy rotation="0">'
        + clickable("[600,200][900,300]", "Edit", photos)
        + clickable("[100,1700][500,1800]", "Delete", photos)
        + "</hierarchy></window>"
        + win.format(layer=11, b="[0,0][1080,2400]", a="true")
        + '<hierarchy rotation="0">'
        + clickable("[100,1650][400,1850]", "Messages", chooser)
        + clickable("[500,1650][800,1850]", "Copy", chooser)
        + "</hierarchy></window></display></displays>"
    )
    scene = parse_scene(dump, (1080, 2400), chooser)
    assert [e.text for e in scene.elements] == ["Messages", "Copy"]
    assert scene.package == chooser


def _bars_over(app: str, windows: bool) -> str:
    """A dump of `app`'s nodes under the status bar and a three-button navigation bar."""
    status = NODE.format(
        b="[0,0][1080,128]",
        text="9:41",
        rid="",
        cls="android.widget.TextView",
        click="false",
        kids="",
    ).replace('package="com.example"', 'package="com.android.systemui"')
    nav = NODE.format(
        b="[0,2274][1080,2400]",
        text="",
        rid="com.android.systemui:id/home",
        cls="android.widget.ImageView",
        click="true",
        kids="",
    ).replace('package="com.example"', 'package="com.android.systemui"')
    root = _node("[0,0][1080,2400]", cls="android.widget.FrameLayout", kids=app)
    if not windows:
        return f'<hierarchy rotation="0">{root}{status}{nav}</hierarchy>'
    win = '<window type="{t}" layer="{layer}" bounds="{b}" active="{a}" focused="{a}">'
    return (
        '<displays><display id="0">'
        + win.format(t="TYPE_SYSTEM", layer=20, b="[0,0][1080,128]", a="false")
        + f'<hierarchy rotation="0">{status}</hierarchy></window>'
        + win.format(t="TYPE_SYSTEM", layer=19, b="[0,2274][1080,2400]", a="false")
        + f'<hierarchy rotation="0">{nav}</hierarchy></window>'
        + win.format(t="TYPE_APPLICATION", layer=10, b="[0,0][1080,2400]", a="true")
        + f'<hierarchy rotation="0">{root}</hierarchy></window></display></displays>'
    )


def test_the_system_bars_cover_what_an_edge_to_edge_app_draws_under_them() -> None:
    """An edge-to-edge app (every app targeting Android 15) draws under the status and
    navigation bars, and a list row scrolled half under the navigation bar kept its whole
    bounds: its centre, where a tap on it lands, was on the bar (on three-button navigation,
    the Home button). Like the keyboard, the bars now cover what lies under them: the part in
    view is the target, and a row wholly under a bar is out of reach."""
    app = (
        NODE.format(b="[0,2180][1080,2400]", text="Row half under the bar", rid="",
                    cls="android.widget.TextView", click="true", kids="")
        + NODE.format(b="[0,60][1080,260]", text="Title under the status bar", rid="",
                      cls="android.widget.TextView", click="true", kids="")
        + NODE.format(b="[0,2290][1080,2390]", text="Row wholly under the bar", rid="",
                      cls="android.widget.TextView", click="true", kids="")
    )  # fmt: skip
    for windows in (True, False):
        scene = parse_scene(_bars_over(app, windows), (1080, 2400), "com.example")
        by_text = {e.text: e.bounds.to_list() for e in scene.elements}
        assert by_text["Row half under the bar"] == [0, 2180, 1080, 2274], windows
        assert by_text["Title under the status bar"] == [0, 128, 1080, 260], windows
        assert "Row wholly under the bar" not in by_text, windows


def test_a_permission_prompt_is_seen_as_one() -> None:
    scene = parse_scene(_load("permission_prompt_camera_1080x2400.xml"))
    assert scene.overlays == ["permission_prompt"]
    assert scene.package == "com.google.android.permissioncontroller"
    assert scene.page_title == "Allow Camera to take pictures and record video?"
    buttons = [e.text for e in scene.elements if e.clickable]
    assert buttons == ["While using the app", "Only this time", "Don’t allow"]


def test_the_permission_controllers_settings_page_is_an_app_not_a_prompt() -> None:
    """Settings > Apps > Contacts > Permissions > Camera is a full-screen page of the
    permission controller itself. Its package alone made it a "permission prompt": the
    planner was told a prompt covered the screen (and the offline planner answers a prompt
    by declining it or pressing Back), on the very page a task about permissions needs.
    Only the prompt's own buttons (permission_allow_* / permission_deny_*) make one now."""
    scene = parse_scene(_load("permission_settings_camera_1080x2400.xml"), (1080, 2400), None)
    assert scene.overlays == []
    assert scene.package == "com.google.android.permissioncontroller"
    choices = [e.text for e in scene.elements if e.checkable]
    assert choices == [
        "Allow all the time",
        "Allow only while using the app",
        "Ask every time",
        "Don’t allow",
    ]
    prompt = parse_scene(_load("permission_prompt_camera_1080x2400.xml"))
    assert prompt.overlays == ["permission_prompt"]


def test_an_anr_dialog_hides_the_app_under_it() -> None:
    scene = parse_scene(_load("u2_anr_over_settings_1080x2400.xml"), (1080, 2400), None)
    assert scene.overlays == ["app_not_responding"]
    assert scene.package == "android"
    assert scene.page_title == "System UI isn't responding"
    assert [e.text for e in scene.elements if e.clickable] == ["Close app", "Wait"]
    assert "Network & internet" not in [e.text for e in scene.elements]


def test_one_elements_text_is_capped_with_a_marker() -> None:
    chat = _load("u2_chat_control_chars_1080x2400.xml")
    history = "msg " * 14_000  # 56,000 characters in one text node (a whole chat history)
    scene = parse_scene(chat.replace("Are we still on for Saturday?", history))
    long = next(e for e in scene.elements if e.text.startswith("msg msg"))
    assert len(long.text) < TEXT_CAP + 40
    assert long.text.endswith(f"… [{len(history.strip()) - TEXT_CAP} more characters]")


def test_the_scene_is_bounded_keeping_what_a_finger_can_do() -> None:
    rows = "".join(_node(f"[0,{100 + i}][1080,{101 + i}]", f"line {i} " * 20) for i in range(2000))
    button = NODE.format(
        b="[0,2200][1080,2300]",
        text="Send",
        rid="",
        cls="android.widget.Button",
        click="true",
        kids="",
    )
    dump = (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">"
        + _node("[0,0][1080,2400]", cls="android.widget.FrameLayout", kids=rows + button)
        + "</hierarchy>"
    )
    scene = parse_scene(dump, (1080, 2400), "com.example")
    assert len(scene.elements) <= MAX_ELEMENTS
    assert sum(len(e.text) for e in scene.elements) <= MAX_SCENE_TEXT + TEXT_CAP
    assert scene.omitted == 2001 - len(scene.elements)
    assert "Send" in [e.text for e in scene.elements]  # actionable elements are kept first
    assert scene.to_prompt()["omitted"] == scene.omitted


def test_without_the_drivers_screen_size_off_screen_pages_are_not_kept() -> None:
    """A pager's off-screen pages (bounds past the screen's right edge) must not count as
    screen: 87 elements, not 1,740."""
    pages = []
    for page in range(20):
        x = page * 1080
        items = "".join(
            _node(f"[{x + 10},{100 + i * 24}][{x + 1070},{120 + i * 24}]", f"p{page} item {i}")
            for i in range(87)
        )
        pages.append(_node(f"[{x},0][{x + 1080},2400]", cls="android.view.ViewGroup", kids=items))
    dump = (
        '<hierarchy rotation="0">'
        + _node("[0,0][1080,2400]", cls="android.widget.FrameLayout", kids="".join(pages))
        + "</hierarchy>"
    )
    scene = parse_scene(dump)  # no screen size from a driver
    assert (scene.screen_width, scene.screen_height) == (1080, 2400)
    assert len(scene.elements) == 87
    assert all(e.text.startswith("p0 ") for e in scene.elements)


def test_surrogate_pair_references_become_one_character() -> None:
    xml = (
        '<hierarchy rotation="0"><node text="hi &#55357;&#56832; &#xD83D;&#xDE00;'
        ' lone &#55357; x" class="android.widget.TextView" package="p"'
        ' bounds="[0,0][100,100]" /></hierarchy>'
    )
    scene = parse_scene(xml, (1080, 2400))
    assert scene.elements[0].text == "hi 😀 😀 lone  x"
    # Already whole references and text without any are left alone.
    assert join_surrogate_refs("a &#128512; &#10;&#65;") == "a &#128512; &#10;&#65;"
    assert join_surrogate_refs("&#65;&#55357;&#56832;") == "&#65;&#128512;"


def test_unescaped_markup_in_texts_is_repaired_and_only_there() -> None:
    """A raw `&` or `<` in a text (a ROM's dumper that does not escape) made the dump
    unreadable; both are escaped inside attribute values, references stay as they are, and
    a well-formed dump comes back unchanged with no repair named."""
    raw = (
        '<hierarchy rotation="0"><node text="Q&A <b>x</b> &amp; &#38; &lt;"'
        ' bounds="[0,0][100,100]" clickable="true" package="p" /></hierarchy>'
    )
    fixed, note = repair_dump(raw)
    assert "2 unescaped" not in note and "3 unescaped '&' or '<' characters" in note
    assert parse_scene(fixed).elements[0].text == "Q&A <b>x</b> & & <"
    assert repair_dump(fixed) == (fixed, "")
