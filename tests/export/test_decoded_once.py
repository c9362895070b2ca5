"""An export decodes each screenshot once (the report, the GIF, the MP4 and the readability check
all show it), and a drawing on one view of a screenshot never reaches another view of it."""

from __future__ import annotations

from typing import Any

import pytest
from PIL import Image

from export.bundle import bundle_bytes
from export.overlay import annotated, base_image, decoded_once
from export.run import Run
from host.timeline.export_source import run_from_timeline
from planner.image_read import open_image
from tests.export.conftest import HOST, T_GESTURES, Timeline


def _run(timeline: Timeline) -> Run:
    run = run_from_timeline(timeline.store, T_GESTURES, HOST)
    assert run is not None
    return run


def test_an_export_decodes_each_screenshot_once(
    timeline: Timeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding and shrinking a 1080 × 2400 PNG was half of an export's CPU, and each was done
    five times or more (readability check, report, GIF, MP4, the video's canvas size)."""
    run = _run(timeline)
    decoded: list[bytes] = []

    def counted(data: bytes, *args: Any, **kwargs: Any) -> Image.Image:
        decoded.append(data)
        return open_image(data, *args, **kwargs)

    monkeypatch.setattr("export.overlay.open_image", counted)  # what the export calls
    bundle_bytes(run)
    shown = {png for s in run.steps for png in (s.before_png, s.after_png) if png}
    assert len(shown) >= 3, "the run should have several screenshots"
    assert set(decoded) == shown
    assert len(decoded) == len(shown), "a screenshot was decoded more than once"


def test_a_drawing_on_a_screenshot_does_not_reach_its_other_views(timeline: Timeline) -> None:
    """The GIF and MP4 draw each step's action on its before screenshot, which is often the
    step before's after screenshot: shared, the after frame would show the next action."""
    step = next(s for s in _run(timeline).steps if s.before_png)
    plain = base_image(step).tobytes()
    with decoded_once():
        drawn = annotated(step).tobytes()
        again = base_image(step).tobytes()
        drawn_again = annotated(step).tobytes()
    assert drawn != plain, "the step's action should be drawn on its screenshot"
    assert again == plain
    assert drawn_again == drawn
