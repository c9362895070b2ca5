"""Drive a phone the way a scripted test (or a dumb agent) would: through adbutils only.

Every step reads the screen through `uiautomator dump` + sync pull and acts with `adb shell
input`, so a script that reaches a goal proves the goal is reachable over the real protocol.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import adbutils

_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")


class AdbScript:
    def __init__(self, device: adbutils.AdbDevice) -> None:
        self.d = device
        self.width, self.height = device.window_size()

    def nodes(self) -> list[ET.Element]:
        root = ET.fromstring(self.d.dump_hierarchy())
        return list(root.iter("node"))

    def center(self, *, text: str = "", rid: str = "") -> tuple[int, int] | None:
        for node in self.nodes():
            if (text and text in (node.get("text"), node.get("content-desc"))) or (
                rid and node.get("resource-id") == rid
            ):
                m = _BOUNDS.fullmatch(node.get("bounds", ""))
                assert m, node.attrib
                x1, y1, x2, y2 = (int(v) for v in m.groups())
                return (x1 + x2) // 2, (y1 + y2) // 2
        return None

    def nodes_with(self, *, rid: str) -> list[ET.Element]:
        return [n for n in self.nodes() if n.get("resource-id") == rid]

    def click_node(self, node: ET.Element) -> None:
        m = _BOUNDS.fullmatch(node.get("bounds", ""))
        assert m, node.attrib
        x1, y1, x2, y2 = (int(v) for v in m.groups())
        self.d.click((x1 + x2) // 2, (y1 + y2) // 2)

    def scroll_down(self) -> None:
        x = self.width // 2
        self.d.swipe(x, int(self.height * 0.75), x, int(self.height * 0.35), 0.3)

    def scroll_up(self) -> None:
        x = self.width // 2
        self.d.swipe(x, int(self.height * 0.35), x, int(self.height * 0.75), 0.3)

    def tap(self, text: str = "", *, rid: str = "", scrolls: int = 4) -> None:
        """Tap the element with this text/content-desc (or resource-id), scrolling to find it."""
        for _ in range(scrolls + 1):
            point = self.center(text=text, rid=rid)
            if point is not None:
                self.d.click(*point)
                return
            self.scroll_down()
        raise AssertionError(f"{text or rid!r} is not on screen")

    def type(self, text: str) -> None:
        self.d.send_keys(text)

    def key(self, code: str) -> None:
        self.d.keyevent(code)

    def launch(self, package: str) -> None:
        self.d.app_start(package)
