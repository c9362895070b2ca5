"""Screenshots an export cannot read, or that claim a huge size: the export is made anyway,
at the width it shows, and says what it left out.

A damaged screenshot stored before the cloud decoded uploads made every export of its task
fail (the CLI blamed the zip's path, the console's Download answered 500), and a small PNG or
an observation claiming 12000 or 16384 pixels a side was decoded or drawn at that size
(hundreds of MB, tens of seconds). Real Pillow images built byte by byte, a real zip on disk.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

from PIL import Image

from amc.v1 import types_pb2
from console.exporting import write_export
from export.bundle import bundle_bytes, read_bundle
from export.overlay import annotated, base_image
from export.run import Run, Step
from planner.scene import Scene
from tests.support.screenshots import bilevel_png, cut_jpeg, png_with_bad_data

#: The width the report and the video show screenshots at (`export.overlay.WIDTH`).
SHOWN = 360


def tap_step(before: bytes | None = None, after: bytes | None = None, **screen: int) -> Step:
    action = types_pb2.Action()
    action.tap.point.x, action.tap.point.y = 50, 60
    step = Step(attempt=1, step_index=1, tool_name="tap", action=action)
    step.before_png, step.after_png = before, after
    if screen:
        step.screen = Scene([], "com.example", "Home", screen["width"], screen["height"])
    return step


def damaged_run() -> Run:
    run = Run(task_id="t-damaged", goal="open it", status="succeeded", result="done")
    run.steps.append(tap_step(cut_jpeg(), png_with_bad_data()))
    return run


def test_a_damaged_screenshot_is_left_out_with_a_note_and_the_export_is_made() -> None:
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(damaged_run()))) as z:
        notes = json.loads(z.read("run.json"))["notes"]
        assert not [n for n in z.namelist() if n.startswith("screenshots/")]
        report = z.read("report.html").decode()
    unread = [n for n in notes if "could not be read" in n]
    assert len(unread) == 2, notes
    assert unread[0].startswith("attempt 1 step 1: the before screenshot could not be read")
    assert "truncated" in unread[0]
    assert unread[1].startswith("attempt 1 step 1: the after screenshot could not be read")
    assert "the before screenshot could not be read" in report


def test_the_cli_writes_the_export_of_a_run_with_a_damaged_screenshot(tmp_path: Path) -> None:
    """`amc task export` exited 2 with "cannot write <zip>: image file is truncated" (and
    wrote no zip): an image's error was taken for the file's."""
    path = write_export(damaged_run(), tmp_path / "out.zip")
    with zipfile.ZipFile(path) as z:
        assert "report.html" in z.namelist()


def test_a_frame_without_a_screenshot_is_built_at_the_width_shown() -> None:
    """An observation may say 16384 x 16384: the plain frame was built that size (800 MB)."""
    step = tap_step(width=4000, height=6000)
    assert base_image(step).size == (SHOWN, 540)
    assert annotated(step).size == (SHOWN, 540)


def test_a_large_screenshot_is_decoded_at_the_width_shown() -> None:
    big = io.BytesIO()
    Image.new("RGB", (4000, 6000), "navy").save(big, "JPEG")
    step = tap_step(big.getvalue(), bilevel_png(3000, 4500))
    assert annotated(step).size == (SHOWN, 540)
    assert base_image(step, "after").size == (SHOWN, 540)


def test_a_screenshot_over_the_cap_shows_as_a_plain_frame() -> None:
    """Stored before the cloud refused them: 8000 x 8000 pixels (64 M, over the 40 M cap)."""
    step = tap_step(bilevel_png(8000, 8000), width=1080, height=2400)
    frame = base_image(step)
    assert frame.size == (SHOWN, 800)
    assert frame.getpixel((0, 0)) == (238, 238, 242)  # the plain frame's paper, not white


def test_a_jpeg_screenshot_is_named_jpg_and_reads_back_as_it_was() -> None:
    """The cloud takes JPEG uploads; the export named them `.png` and could not read its own
    JPEG back (`read_bundle` took `.png` names only)."""
    jpeg, png = io.BytesIO(), io.BytesIO()
    Image.new("RGB", (60, 120), "navy").save(jpeg, "JPEG")
    Image.new("RGB", (60, 120), "teal").save(png, "PNG")
    run = Run(task_id="t-jpeg", goal="open it", status="succeeded", result="done")
    run.steps.append(tap_step(jpeg.getvalue(), png.getvalue()))
    data = bundle_bytes(run)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        shots = sorted(n for n in z.namelist() if n.startswith("screenshots/"))
    assert shots == ["screenshots/a1-s001-after.png", "screenshots/a1-s001-before.jpg"]
    back = read_bundle(data)
    assert back.steps[0].before_png == jpeg.getvalue()
    assert back.steps[0].after_png == png.getvalue()
