"""The hierarchy parser on real uiautomator dumps from real phones (see fixtures/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from host.perception.hierarchy import HierarchyError, parse_nodes, parse_scene, ui_tree_nodes

FIXTURES = Path(__file__).parent / "fixtures"


def _load(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_settings_home_dump_becomes_a_compact_scene() -> None:
    xml = _load("settings_home_1080x2400.xml")
    _, nodes = parse_nodes(xml)
    scene = parse_scene(xml)

    assert scene.package == "com.android.settings"
    assert (scene.screen_width, scene.screen_height) == (1080, 2400)
    assert scene.page_title == "Settings"
    # Layout wrappers and bare icons are dropped: far fewer elements than nodes.
    assert len(scene.elements) < len(nodes) / 2
    texts = [e.text for e in scene.elements]
    assert "Display & brightness" in texts  # XML entities decoded
    assert "Network & internet" in texts
    search = next(e for e in scene.elements if e.content_desc == "Search settings")
    assert search.clickable
    assert search.bounds.center == (978, 440)
    # Clickable rows whose label lives in a child TextView are kept as tap targets.
    display = next(e for e in scene.elements if e.text == "Display & brightness")
    row = next(
        e
        for e in scene.elements
        if e.clickable
        and e.bounds.top <= display.bounds.top
        and e.bounds.bottom >= display.bounds.bottom
    )
    assert row.bounds.to_list() == [0, 1861, 1080, 2087]


def test_ids_are_deterministic_and_short() -> None:
    xml = _load("settings_home_1080x2400.xml")
    a, b = parse_scene(xml), parse_scene(xml)
    assert [e.element_id for e in a.elements] == [e.element_id for e in b.elements]
    assert [e.element_id for e in a.elements] == [f"e{i}" for i in range(1, len(a.elements) + 1)]
    assert [e.to_prompt() for e in a.elements] == [e.to_prompt() for e in b.elements]


def test_pixel5_dump_toolbar_title_and_desc_only_buttons() -> None:
    scene = parse_scene(_load("talos_a11y_dev_1080x2160.xml"))
    assert scene.package == "com.balsdon.accessibilityDeveloperService"
    assert scene.page_title == "Accessibility Broadcast Dev"
    descs = {e.content_desc for e in scene.elements if e.clickable}
    assert {"Decrease accessibility volume", "Increase accessibility volume"} <= descs
    # A zero-size node ("Heading 3" at [0,0][0,0]) is not on screen.
    assert "Heading 3" not in [e.text for e in scene.elements]
    multi = next(e for e in scene.elements if e.text.startswith("Run"))
    assert "\n" in multi.text


def test_ui_tree_nodes_are_structured() -> None:
    scene = parse_scene(_load("talos_a11y_dev_1080x2160.xml"))
    nodes = ui_tree_nodes(scene)
    assert len(nodes) == len(scene.elements)
    assert all({"id", "bounds", "source", "center"} <= set(n) for n in nodes)


def test_screen_size_and_package_from_driver_win() -> None:
    scene = parse_scene(_load("talos_a11y_dev_1080x2160.xml"), (1080, 2160), "com.example")
    assert scene.package == "com.example"
    assert scene.screen_height == 2160


@pytest.mark.parametrize(
    "xml",
    [
        "",
        '<?xml version="1.0" encoding="UTF-8"?><hierarchy rotation="0" />',
        "<hierarchy rotation='0'><node bounds='[0,0][10,10]'",
        "ERROR: could not get idle state.",
        "<html><body/></html>",
    ],
)
def test_empty_or_malformed_dumps_raise(xml: str) -> None:
    with pytest.raises(HierarchyError):
        parse_scene(xml)
