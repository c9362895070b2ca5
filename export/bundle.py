"""The export on disk: one zip a person can attach to a bug report or feed to a training job.

    report.html          the self-contained report
    run.gif, run.mp4     the video
    steps.jsonl          the dataset, one line per step (docs/export.md)
    step.schema.json     the JSON Schema of a steps.jsonl line
    run.json             the run as a whole (goal, status, result, attempts, notes)
    screenshots/         the original screenshots the lines name (none in a cloud-only export)

`read_bundle` reads one back into a `Run` (what `merge` needs); anything that is not such an
export is a `BundleError` naming what is wrong, and nothing is written.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from export import dataset, report, video
from export.overlay import WIDTH, decoded_once, screenshot
from export.run import Run, Step
from planner.image_read import UnreadableImage

_SHOT = re.compile(r"^screenshots/[A-Za-z0-9._-]{1,100}\.(?:png|jpg)$")
_JPEG_MAGIC = b"\xff\xd8\xff"
#: Largest export read back (a zip bomb is refused before it is unpacked).
MAX_READ_BYTES = 2 * 1024**3


class BundleError(ValueError):
    """Not an amc export, or a damaged one."""


#: Every file's time in the zip: the wall clock made two exports of the same run two different
#: zips (a checksum could not tell a changed record from a new export); this is the earliest
#: time a zip can hold, as reproducible builds use.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _put(z: zipfile.ZipFile, name: str, data: str | bytes, *, stored: bool = False) -> None:
    """Write `name` into `z` with a fixed time (`_ZIP_TIME`); `stored`: not compressed again
    (PNG, JPEG, GIF and MP4 are compressed already)."""
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    z.writestr(info, data)


def _names(step: Step, written: dict[bytes, str]) -> tuple[str | None, str | None]:
    """File names of the step's screenshots. An image already written (a step's after is the
    next step's before) is named again, not stored twice; `written` maps bytes to names."""
    stem = f"screenshots/a{step.attempt}-s{step.step_index:03d}"
    out: list[str | None] = []
    for which, png in (("before", step.before_png), ("after", step.after_png)):
        if not png:
            out.append(None)
            continue
        out.append(written.setdefault(png, f"{stem}-{which}.{_extension(png)}"))
    return out[0], out[1]


def _extension(image: bytes) -> str:
    """The file name's extension for a stored screenshot's bytes. The cloud takes JPEG uploads
    as well as PNG; a JPEG named `.png` opened as nothing in viewers that trust the name."""
    return "jpg" if image.startswith(_JPEG_MAGIC) else "png"


def gap_notes(run: Run) -> list[str]:
    """What the reader should know the export lacks."""
    notes = list(run.notes)
    bare = sum(1 for s in run.steps if not s.before_png)
    if bare:
        where = (
            "the cloud keeps no screenshots: merge the host's export "
            f"(amc task export {run.task_id} --merge <host export>.zip)"
            if run.origin == "cloud"
            else "the source kept none for them"
        )
        notes.append(f"{bare} of {len(run.steps)} steps have no screenshot ({where})")
    return notes


def readable(run: Run) -> Run:
    """`run` without the screenshots that cannot be read, each named in a note: one damaged
    screenshot (stored before the cloud decoded uploads) made every export of its task fail,
    so it could never be exported. Its step shows a plain frame, as one without a screenshot."""
    steps: list[Step] = []
    notes = list(run.notes)
    for step in run.steps:
        for which in ("before", "after"):
            png = step.before_png if which == "before" else step.after_png
            if not png:
                continue
            try:
                screenshot(png, WIDTH)  # as the report and video read it (`decoded_once`)
            except UnreadableImage as exc:
                if which == "before":
                    step = replace(step, before_png=None)
                else:
                    step = replace(step, after_png=None)
                notes.append(
                    f"attempt {step.attempt} step {step.step_index}: the {which} screenshot "
                    f"could not be read ({exc}); a plain frame stands in for it"
                )
        steps.append(step)
    return replace(run, steps=steps, notes=notes)


def write_bundle(run: Run, out: BinaryIO) -> None:
    """Write the export of `run` as a zip to `out` (`run` itself is left as it was)."""
    with decoded_once():
        _write_bundle(run, out)


def _write_bundle(run: Run, out: BinaryIO) -> None:
    run = readable(run)
    run = replace(run, steps=sorted(run.steps, key=lambda s: s.key), notes=gap_notes(run))
    per_attempt: dict[int, int] = {}
    for s in run.steps:
        per_attempt[s.attempt] = per_attempt.get(s.attempt, 0) + 1
    position: dict[int, int] = {}
    lines: list[str] = []
    written: dict[bytes, str] = {}
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for i, step in enumerate(run.steps):
            names = _names(step, written)
            for name, png in zip(names, (step.before_png, step.after_png), strict=True):
                if name is not None and png is not None and name not in z.NameToInfo:
                    _put(z, name, png, stored=True)
            step_id = position.get(step.attempt, 0)
            position[step.attempt] = step_id + 1
            before = run.steps[i - 1] if i else None
            record = dataset.step_record(
                run, step, step_id, per_attempt[step.attempt], names, before
            )
            lines.append(record.model_dump_json())
        _put(z, "steps.jsonl", "".join(line + "\n" for line in lines))
        _put(z, "step.schema.json", dataset.schema_json())
        _put(z, "run.json", dataset.run_record(run).model_dump_json(indent=2) + "\n")
        _put(z, "report.html", report.render_report(run))
        _put(z, "run.gif", video.gif(run), stored=True)
        _put(z, "run.mp4", video.mp4(run), stored=True)


def bundle_bytes(run: Run) -> bytes:
    buf = io.BytesIO()
    write_bundle(run, buf)
    return buf.getvalue()


def write_file(data: bytes, path: Path) -> Path:
    """Write an export's bytes (`bundle_bytes`) to `path` through a temporary file: a failure
    leaves no half zip. Made apart from the writing, so that only the writing's errors are
    the path's (a damaged screenshot read as "cannot write <path>")."""
    tmp = path.with_name(path.name + ".part")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_bundle(source: Path | bytes) -> Run:
    """An export written by `write_bundle` back as a `Run`, screenshots included."""
    try:
        z = zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BundleError(f"not a zip file: {exc}") from None
    with z:
        if sum(i.file_size for i in z.infolist()) > MAX_READ_BYTES:
            raise BundleError("the export unpacks to more than 2 GiB; refusing to read it")
        names = set(z.namelist())
        for needed in ("run.json", "steps.jsonl"):
            if needed not in names:
                raise BundleError(f"not an amc export: {needed} is missing")
        try:
            head = dataset.parse_run(z.read("run.json"))
        except ValidationError as exc:
            raise BundleError(f"run.json: {_first_error(exc)}") from None
        run = Run(
            task_id=head.task_id,
            goal=head.goal,
            status=head.status,
            result=head.result,
            origin=head.origin,
            attempts={int(k): v for k, v in head.attempts.items() if k.isdigit()},
            notes=[n for n in head.notes if "have no screenshot" not in n],
            failed_calls=dataset.failed_calls_from_record(head),
            pruned=dataset.pruned_from_record(head),
            unsettled=dataset.unsettled_from_record(head),
        )
        text = z.read("steps.jsonl").decode("utf-8", errors="replace")
        system_prompts: dict[int, str] = {}  # per attempt: the one in force (/2 writes changes)
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = dataset.parse_line(line)
            except ValidationError as exc:
                raise BundleError(f"steps.jsonl line {number}: {_first_error(exc)}") from None
            shots = [
                _read_shot(z, names, name, number)
                for name in (record.screenshot, record.screenshot_after)
            ]
            step = dataset.step_from_record(
                record, shots[0], shots[1], system_prompts.get(record.attempt, "")
            )
            system_prompts[record.attempt] = step.system_prompt
            run.steps.append(step)
    run.sort()
    return run


def _read_shot(z: zipfile.ZipFile, names: set[str], name: str | None, line: int) -> bytes | None:
    if name is None:
        return None
    if not _SHOT.match(name) or name not in names:
        raise BundleError(f"steps.jsonl line {line}: no screenshot {name!r} in the export")
    return z.read(name)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "value"
    return f"{where}: {err['msg']}"


def manifest(path: Path) -> dict[str, object]:
    """run.json of an export, for a one-line summary."""
    with zipfile.ZipFile(path) as z:
        value = json.loads(z.read("run.json"))
    return value if isinstance(value, dict) else {}
