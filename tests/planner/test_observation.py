"""The typed screen observation and the scene the model is shown: one conversion each way."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from amc.v1 import types_pb2
from cloud.wire import check_text
from host.perception.hierarchy import parse_scene
from planner.observation import (
    MAX_ELEMENTS,
    MAX_TEXT_BYTES,
    observation_from_scene,
    observation_problem,
    scene_from_observation,
)
from planner.scene import Bounds, Element, OcrObservation, Scene
from tests.planner import scenes

FIXTURES = Path(__file__).resolve().parents[1] / "host" / "fixtures"


def test_a_perceived_scene_survives_the_round_trip() -> None:
    """What the Python host perceives is exactly what the cloud's scene says (ids, bounds,
    flags, page), so both sides resolve the model's element ids alike."""
    scene = parse_scene((FIXTURES / "settings_home_1080x2400.xml").read_text(), (1080, 2400))
    scene = replace(
        scene,
        activity="com.android.settings/.Settings",
        keyboard_shown=True,
        elements=[
            *scene.elements,
            Element("e999", Bounds(10, 20, 110, 60), text="drawn text", source="ocr"),
        ],
        ocr=[OcrObservation("drawn text", Bounds(10, 20, 110, 60), 91.5)],
    )
    observation = observation_from_scene(scene)
    assert observation_problem(observation) is None
    again = scene_from_observation(observation)
    assert again == scene
    assert again.to_prompt() == scene.to_prompt()


def test_what_a_host_does_not_say_the_cloud_works_out() -> None:
    """A host that sends no title or package (a Node host, say) still gets a page name: the
    package covering most of the screen and the top-most heading."""
    scene = scenes.toggle_page("Display", [("Dark theme", False)])
    scene.elements = [replace(e, package="com.android.settings") for e in scene.elements]
    observation = observation_from_scene(scene)
    observation.title = ""
    observation.foreground_package = ""
    derived = scene_from_observation(observation)
    assert derived.package == "com.android.settings"
    assert derived.page_title == "Display"
    assert derived.page == scene.page


def test_long_texts_and_too_many_elements_are_clipped_not_refused() -> None:
    big = "é" * MAX_TEXT_BYTES  # two bytes each
    elements = [
        Element(f"e{i}", Bounds(0, i, 10, i + 1), text=big if i == 1 else "x")
        for i in range(1, MAX_ELEMENTS + 50)
    ]
    observation = observation_from_scene(Scene(elements, "pkg", "t", 1080, 2400))
    assert observation_problem(observation) is None
    assert len(observation.elements) == MAX_ELEMENTS
    text = observation.elements[0].text
    assert len(text.encode()) <= MAX_TEXT_BYTES
    assert text.endswith("…")
    assert text.startswith("éé")  # never cut inside a character


def test_the_prompt_mentions_rotation_activity_and_keyboard_only_when_known() -> None:
    plain = scenes.launcher().to_prompt()
    assert set(plain) == {"app", "page", "screen", "elements"}
    told = replace(
        scenes.launcher(), rotation=1, activity="com.x/.Main", keyboard_shown=True
    ).to_prompt()
    assert (told["rotation"], told["activity"], told["keyboard"]) == (90, "com.x/.Main", "shown")
    observation = observation_from_scene(replace(scenes.launcher(), rotation=3))
    assert observation.rotation == types_pb2.ROTATION_270
    assert scene_from_observation(observation).rotation == 3


def test_nul_and_unpaired_surrogates_from_a_phone_are_replaced_not_refused() -> None:
    """A real dump's text can hold a NUL, which the contract refuses in every text field: the
    host replaces it, so the step can still be planned (and the model sees where it was)."""
    scene = Scene(
        [Element("e1", Bounds(0, 0, 10, 10), text="Wi\x00Fi", content_desc="bad \ud800 half")],
        "pkg",
        "t",
        1080,
        2400,
        ocr=[OcrObservation("o\x00cr", Bounds(0, 0, 5, 5), 80.0)],
    )
    observation = observation_from_scene(scene)
    assert check_text(observation) is None
    assert observation_problem(observation) is None
    assert observation.elements[0].text == "Wi\ufffdFi"
    assert observation.elements[0].content_description == "bad ? half"
    assert observation.ocr_blocks[0].text == "o\ufffdcr"
    observation.SerializeToString()  # encodable
