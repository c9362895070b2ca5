"""The video of a run: the report's annotated screenshots in order, a caption per step, as an
animated GIF (Pillow) and an H.264 MP4 (PyAV, whose wheel carries FFmpeg: nothing is downloaded
at run time).

Frames: a title card with the goal, then per step its before screenshot with the action drawn on
it and a caption (step, action, a resumed decision's mark, purpose, verdict), and its after
screenshot when the action changed the screen; a closing card with the result. Every frame has
the same size (the first screen's aspect, `WIDTH` wide), letterboxed.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import av
from PIL import Image, ImageDraw

from export.overlay import DEFAULT_SCREEN, INK, WIDTH, annotated, base_image, fit_width, font, wrap
from export.run import Run, Step
from planner.describe import describe

CAPTION = 120
#: The MP4's frame rate: a frame shown for 1.5 s is six identical frames, which H.264 stores in
#: a few bytes each (a constant rate keeps every player happy).
FPS = 4
TITLE_S, BEFORE_S, AFTER_S, END_S = 2.0, 2.0, 1.0, 2.5


@dataclass(frozen=True, slots=True)
class Frame:
    image: Image.Image
    seconds: float
    #: (attempt, step) the frame shows; None for the title and closing cards.
    step: tuple[int, int] | None = None


def _canvas_size(run: Run) -> tuple[int, int]:
    first = next((s for s in run.steps), None)
    w, h = base_image(first).size if first is not None else DEFAULT_SCREEN
    screen_h = round(h * WIDTH / w)
    return WIDTH, (screen_h + CAPTION + 1) // 2 * 2  # even sides: H.264 wants them


def _compose(size: tuple[int, int], screen: Image.Image | None, lines: list[str]) -> Image.Image:
    canvas = Image.new("RGB", size, (255, 255, 255))
    area = (size[0], size[1] - CAPTION)
    if screen is not None:
        shot = fit_width(screen, area[0])
        if shot.height > area[1]:
            shot = shot.resize((round(shot.width * area[1] / shot.height), area[1]))
        canvas.paste(shot, ((area[0] - shot.width) // 2, (area[1] - shot.height) // 2))
    draw = ImageDraw.Draw(canvas)
    draw.rectangle((0, area[1], size[0], size[1]), fill=INK)
    y = area[1] + 8
    for i, line in enumerate(lines):
        size_px = 16 if i == 0 else 13
        draw.text((10, y), line, fill=(255, 255, 255), font=font(size_px))
        y += size_px + 6
    return canvas


#: A step's caption line when its decision went on from an answer the model wrote for an
#: earlier request of the step (`Step.resumed_from`), as the report and both consoles mark it:
#: unmarked, the video showed that answer's purpose as the model's reply to this screen.
RESUMED_LINE = "resumed from a kept answer (not asked again)"


def caption(step: Step, head: str) -> list[str]:
    """The lines under a step's before screenshot: `head` and the action, whether the decision
    was resumed from a kept answer, the purpose, the verdict; five at most."""
    lines = [f"{head} · {describe(step.action, step.screen)}"[:60]]
    if step.resumed_from is not None:
        lines.append(RESUMED_LINE)
    if step.purpose:
        room = 2 if step.resumed_from is not None else 3  # the verdict keeps its line
        lines += wrap(step.purpose, 13, WIDTH - 20, max_lines=room)
    if step.verdict is not None:
        lines.append(f"verdict: {step.verdict}"[:60])
    return lines[:5]


def frames(run: Run) -> Iterator[Frame]:
    """The video's frames, in order."""
    size = _canvas_size(run)
    title = ["amc run", *wrap(run.goal or run.task_id, 13, WIDTH - 20, max_lines=4)]
    yield Frame(_compose(size, None, title), TITLE_S)
    for s in run.steps:
        head = f"attempt {s.attempt} · step {s.step_index}"
        yield Frame(_compose(size, annotated(s), caption(s, head)), BEFORE_S, s.key)
        if s.after_png and s.after_png != s.before_png:
            after = ["after " + head, *wrap(s.expected_outcome, 13, WIDTH - 20, max_lines=3)]
            yield Frame(_compose(size, base_image(s, "after"), after), AFTER_S, s.key)
    end = [run.status, *wrap(run.result, 13, WIDTH - 20, max_lines=4)]
    yield Frame(_compose(size, None, end), END_S)


def gif(run: Run) -> bytes:
    """The run as an animated GIF that loops."""
    all_frames = list(frames(run))
    buf = io.BytesIO()
    first, *rest = [f.image for f in all_frames]
    first.save(
        buf,
        format="GIF",
        save_all=True,
        append_images=rest,
        duration=[int(f.seconds * 1000) for f in all_frames],
        loop=0,
        optimize=False,
    )
    return buf.getvalue()


def mp4(run: Run) -> bytes:
    """The run as an H.264 MP4 (yuv420p, `FPS` frames a second)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        size = _canvas_size(run)
        stream = container.add_stream("libx264", rate=Fraction(FPS, 1))
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "28", "preset": "veryfast", "tune": "stillimage"}
        for f in frames(run):
            frame = av.VideoFrame.from_image(f.image)  # type: ignore[no-untyped-call]  # PyAV leaves it untyped
            for _ in range(max(1, round(f.seconds * FPS))):
                for packet in stream.encode(frame):
                    container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()
