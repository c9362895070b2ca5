"""A host's export of runs the real agent loop recorded: the zip's files, the dataset against
its documented schema, element ids resolved to points, the video decoded back, and bad exports
refused with a clear error."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import av
import pytest
from markupsafe import escape
from PIL import Image, ImageSequence
from pydantic import ValidationError

from export import dataset
from export.bundle import BundleError, bundle_bytes, read_bundle
from export.merge import MergeError, merge
from export.report import render_report
from export.run import FailedCalls, Judged, Pruned, Run
from export.video import RESUMED_LINE, caption
from host.timeline.export_source import run_from_timeline
from host.timeline.record import TimelineRecord
from host.timeline.store import TimelineStore
from planner.decision import ResumedFrom, ThinkingBlock, Usage, kept
from tests.export.conftest import HOST, T_GESTURES, Timeline
from tests.host.console.host_console_support import SECRET, T_DARK, T_LEGACY, T_SECRET

ROOT = Path(__file__).resolve().parents[2]
FILES = {"report.html", "run.gif", "run.mp4", "steps.jsonl", "step.schema.json", "run.json"}


def host_run(timeline: Timeline, task_id: str) -> Run:
    run = run_from_timeline(timeline.store, task_id, HOST)
    assert run is not None
    return run


def lines(z: zipfile.ZipFile) -> list[dataset.StepRecordV1]:
    text = z.read("steps.jsonl").decode()
    return [dataset.parse_line(line) for line in text.splitlines()]


def test_the_schema_in_the_docs_is_the_one_the_export_writes() -> None:
    documented = (ROOT / "docs" / "export" / "step.schema.json").read_text()
    assert documented == dataset.schema_json(), (
        "run: python -m export.schema > docs/export/step.schema.json"
    )


@pytest.mark.parametrize(
    ("argv", "doc"),
    [
        ([], "step.schema.json"),
        (["--v1"], "step-v1.schema.json"),
        (["--v2"], "step-v2.schema.json"),
    ],
)
def test_the_command_the_schema_test_names_prints_the_documented_schema(
    argv: list[str], doc: str
) -> None:
    """The schema test's message tells whoever changes the models to run
    `python -m export.schema`: that command exists, and what it prints is the docs' file byte
    for byte (so redirecting it into docs/ makes the test pass)."""
    ran = subprocess.run(
        [sys.executable, "-m", "export.schema", *argv],
        cwd=ROOT,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr.decode()
    assert ran.stdout.decode() == (ROOT / "docs" / "export" / doc).read_text()


@pytest.mark.parametrize("task_id", [T_DARK, T_SECRET, T_GESTURES, T_LEGACY])
def test_every_step_is_a_valid_line_with_its_screenshots(timeline: Timeline, task_id: str) -> None:
    run = host_run(timeline, task_id)
    records = timeline.store.steps(task_id, 1)
    assert len(run.steps) == len(records) > 0
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(run))) as z:
        names = set(z.namelist())
        assert names >= FILES
        assert json.loads(z.read("step.schema.json")) == json.loads(dataset.schema_json())
        steps = lines(z)
        head = dataset.RunRecord.model_validate_json(z.read("run.json"))
        for line in z.read("steps.jsonl").decode().splitlines():  # the documented JSON form
            assert set(json.loads(line)) == set(dataset.StepRecord.model_fields)
        assert head.task_id == task_id
        assert head.steps == len(steps)
        assert [s.step_index for s in steps] == [r.step_index for r in records]
        assert [s.step_id for s in steps] == list(range(len(steps)))
        assert {s.episode_length for s in steps} == {len(steps)}
        assert {s.goal for s in steps} == {run.goal}
        for s in steps:
            for name in (s.screenshot, s.screenshot_after):
                if name is not None:
                    assert z.read(name).startswith(b"\x89PNG")
        if task_id != T_LEGACY:
            assert all(s.screenshot for s in steps)
            assert all(s.screen is not None and s.ui_elements for s in steps)


def test_taps_on_named_elements_become_the_elements_centers(timeline: Timeline) -> None:
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(host_run(timeline, T_DARK)))) as z:
        steps = lines(z)
    taps = [s for s in steps if s.amc_action.tool == "tap"]
    assert len(taps) == 2
    for s in taps:
        assert s.action.action_type == "click"
        element = next(e for e in s.ui_elements or [] if e.id == s.action.element_id)
        assert [s.action.x, s.action.y] == element.center
        assert s.action.element_bounds == element.bounds
        b = element.bounds
        assert b[0] <= element.center[0] <= b[2]
        assert b[1] <= element.center[1] <= b[3]
    assert taps[0].purpose == taps[0].step_instruction == "open display settings"
    assert steps[0].action.action_type == "open_app"
    assert steps[0].action.app_name == "com.android.settings"
    assert steps[1].action.action_type == "get_ui_tree"
    assert steps[-1].action.action_type == "status"
    assert steps[-1].action.goal_status == "complete"
    assert taps[0].thinking_kind == "summarized"
    assert taps[0].usage is not None
    assert taps[0].usage.input_tokens == 100
    assert taps[0].outcome.executed is True
    assert taps[0].latency_s is not None
    # The redacted step (3rd call) keeps what kind of blocks it had.
    assert [t.redacted for t in steps[2].thinking] == [True, False, False]


def test_swipes_and_keys_in_the_dataset_vocabulary(timeline: Timeline) -> None:
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(host_run(timeline, T_GESTURES)))) as z:
        steps = lines(z)
    swipe = steps[1].action
    assert swipe.action_type == "swipe"
    assert swipe.direction == "up"
    assert swipe.touch == [540, 1800]
    assert swipe.lift == [540, 700]
    assert swipe.duration_ms == 300
    assert [steps[2].action.action_type, steps[3].action.action_type] == [
        "navigate_back",
        "navigate_home",
    ]
    assert steps[2].action.keycode == "KEYCODE_BACK"
    assert steps[4].action.goal_status == "infeasible"


def test_a_sensitive_value_is_in_no_file_of_the_export(timeline: Timeline) -> None:
    data = bundle_bytes(host_run(timeline, T_SECRET))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        typed = next(s for s in lines(z) if s.amc_action.tool == "input_text")
        assert typed.action.text == "•••"
        assert typed.action.sensitive is True
        assert typed.amc_action.arguments["text"] == "•••"
        assert typed.amc_action.proto["input_text"]["text"] == "•••"
        assert typed.action.x is not None  # the field it typed into, tapped first
        assert "•••" in z.read("report.html").decode()
        for name in z.namelist():
            blob = z.read(name)
            assert SECRET.encode() not in blob, name
            assert SECRET.encode("utf-16-le") not in blob, name


def test_the_video_has_a_frame_per_step(timeline: Timeline) -> None:
    run = host_run(timeline, T_DARK)
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(run))) as z:
        gif, mp4 = z.read("run.gif"), z.read("run.mp4")
    with Image.open(io.BytesIO(gif)) as image:
        assert image.format == "GIF"
        frames_in_gif = sum(1 for _ in ImageSequence.Iterator(image))
        assert frames_in_gif >= len(run.steps) + 2  # title, a frame per step, the result
        size = image.size
        assert image.info["loop"] == 0
    with av.open(io.BytesIO(mp4), mode="r") as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = list(container.decode(video=0))
    assert len(frames) >= len(run.steps) + 2
    assert (frames[0].width, frames[0].height) == size


def test_an_export_reads_back_as_the_same_run(timeline: Timeline) -> None:
    run = host_run(timeline, T_DARK)
    back = read_bundle(bundle_bytes(run))
    assert back.task_id == run.task_id
    assert back.goal == run.goal
    assert [s.key for s in back.steps] == [s.key for s in run.steps]
    for a, b in zip(run.steps, back.steps, strict=True):
        assert b.action == a.action
        assert b.before_png == a.before_png
        assert b.after_png == a.after_png
        assert b.screen == a.screen
        assert b.purpose == a.purpose


def test_the_same_run_exports_to_the_same_files_and_times(timeline: Timeline) -> None:
    """Every file of the zip was stamped with the wall clock of the export, so a run exported
    twice (a retry, the console's Download and `amc task export`) gave two different zips of
    the same content. The second export here is made once the zip's clock (2 s steps) has moved
    on. run.mp4 is left out of the byte comparison: x264 does not always encode the same frames
    to the same bytes (a known gap)."""
    run = host_run(timeline, T_GESTURES)
    first = zipfile.ZipFile(io.BytesIO(bundle_bytes(run)))
    made = time.time() // 2
    while time.time() // 2 == made:
        time.sleep(0.05)
    second = zipfile.ZipFile(io.BytesIO(bundle_bytes(host_run(timeline, T_GESTURES))))
    stamps = [(i.filename, i.date_time, i.external_attr) for i in first.infolist()]
    assert stamps == [(i.filename, i.date_time, i.external_attr) for i in second.infolist()]
    compared = [n for n in first.namelist() if n != "run.mp4"]
    assert [n for n in compared if first.read(n) != second.read(n)] == []


def test_merge_puts_the_hosts_screens_into_the_clouds_record(timeline: Timeline) -> None:
    """The cloud's side has the decisions but no screens; the host's export supplies them."""
    host = read_bundle(bundle_bytes(host_run(timeline, T_DARK)))
    cloud = host_run(timeline, T_DARK)
    cloud.origin = "cloud"
    for s in cloud.steps:
        s.before_png = s.after_png = None
        s.screen = None
        s.rationale = f"cloud: {s.rationale}"
    cloud.steps[2].tool_name = "swipe"  # a step the host recorded otherwise
    merged = merge(cloud, host)
    assert merged.origin == "cloud+host"
    assert [s.rationale for s in merged.steps] == [s.rationale for s in cloud.steps]
    assert all(s.before_png for i, s in enumerate(merged.steps) if i != 2)
    assert merged.steps[2].before_png is None
    assert any("step 3" in n for n in merged.notes)
    other = host_run(timeline, T_SECRET)
    with pytest.raises(MergeError, match="task-secret"):
        merge(cloud, other)


def test_merge_keeps_the_hosts_whole_text_where_the_cloud_holds_it_cut(
    timeline: Timeline,
) -> None:
    """A direct-transport host cuts a text over the decision log's limits when it ships the
    step (`planner.decision.kept`); its timeline keeps it whole. The merge took the cloud's cut text
    over the host's whole one, so the merged export said less than the model read and wrote."""
    host = read_bundle(bundle_bytes(host_run(timeline, T_DARK)))
    step = host.steps[0]
    step.user_prompt = "Goal: dark theme. " * 40
    step.rationale = "Display holds it. " * 40
    step.thinking = [ThinkingBlock("Scroll first. " * 40)]
    cloud = read_bundle(bundle_bytes(host_run(timeline, T_DARK)))
    cloud.origin = "cloud"
    shipped = cloud.steps[0]
    shipped.user_prompt = kept(step.user_prompt, 400, "the prompt the model read")
    shipped.rationale = kept(step.rationale, 400, "this rationale")
    shipped.thinking = [ThinkingBlock(kept(step.thinking[0].text, 400, "this thinking block"))]
    cloud.steps[1].rationale = "the cloud's own words [… cut here: not a cut]"
    merged = merge(cloud, host)
    first = merged.steps[0]
    assert (first.user_prompt, first.rationale) == (step.user_prompt, step.rationale)
    assert [b.text for b in first.thinking] == [step.thinking[0].text]
    assert merged.steps[1].rationale == cloud.steps[1].rationale


def test_merge_keeps_the_hosts_blocks_where_the_cloud_merged_them(timeline: Timeline) -> None:
    """The decision log keeps 64 thinking blocks of a decision and merges a shipped decision's
    blocks past the 63rd into its 64th (cut to one block's limit); the host's timeline keeps
    them all. The merge took the cloud's 64 (the counts differ), so the merged export held one
    run-on block, perhaps cut, where the model wrote seven."""
    host = read_bundle(bundle_bytes(host_run(timeline, T_DARK)))
    step = host.steps[0]
    step.thinking = [ThinkingBlock(f"thought {i}") for i in range(70)]
    cloud = read_bundle(bundle_bytes(host_run(timeline, T_DARK)))
    cloud.origin = "cloud"
    merged_past = "[7 thinking blocks merged into this one: …]\n\nthought 63 [… cut here: …]"
    cloud.steps[0].thinking = [*step.thinking[:63], ThinkingBlock(merged_past)]
    first = merge(cloud, host).steps[0]
    assert [b.text for b in first.thinking] == [f"thought {i}" for i in range(70)]


def test_bad_exports_are_refused_naming_the_problem(timeline: Timeline) -> None:
    good = bundle_bytes(host_run(timeline, T_GESTURES))
    with pytest.raises(BundleError, match="not a zip file"):
        read_bundle(b"plain text")

    def rewrite(drop: str = "", **replace: bytes) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(good)) as z, zipfile.ZipFile(out, "w") as w:
            for name in z.namelist():
                if name != drop:
                    w.writestr(name, replace.get(name.replace(".", "_"), z.read(name)))
        return out.getvalue()

    with pytest.raises(BundleError, match=r"run\.json is missing"):
        read_bundle(rewrite(drop="run.json"))
    steps = good_lines = bundle_lines(good)
    broken = "\n".join([steps[0], '{"schema_version": "amc.export.step/1"}'])
    with pytest.raises(BundleError, match=r"steps\.jsonl line 2"):
        read_bundle(rewrite(steps_jsonl=broken.encode()))
    escaping = good_lines[0].replace('"screenshots/', '"screenshots/../../')
    with pytest.raises(BundleError, match="line 1: no screenshot"):
        read_bundle(rewrite(steps_jsonl=escaping.encode()))


def bundle_lines(data: bytes) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return z.read("steps.jsonl").decode().splitlines()


def test_a_verdict_shows_where_there_is_one_and_nowhere_else(timeline: Timeline) -> None:
    run = host_run(timeline, T_DARK)
    for step in run.steps:  # the fixture's steps carry the host checker's verdicts: start bare
        step.verdict, step.verdict_detail = None, ""
    run.steps[2].verdict, run.steps[2].verdict_detail = "as expected", "the Display page opened"
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(run))) as z:
        html = z.read("report.html").decode()
        steps = lines(z)
    assert html.count('data-field="verdict"') == 1
    assert "verdict: as expected" in html
    assert "the Display page opened" in html
    assert [s.outcome.verdict for s in steps] == [None, None, "as expected", None, None]


def test_the_report_says_what_we_asked_the_model_at_each_step(timeline: Timeline) -> None:
    """Each step's user prompt, and the system prompt where it changes (once an attempt), as
    recorded (sensitive input masked there); the report was missing both."""
    run = host_run(timeline, T_DARK)
    assert all(s.user_prompt and s.system_prompt for s in run.steps)
    html = render_report(run)
    for step in run.steps:
        assert str(escape(step.user_prompt)) in html
    assert html.count(str(escape(run.steps[0].system_prompt))) == 1
    assert html.count('data-field="user-prompt"') == len(run.steps)


def test_a_priced_step_carries_its_cost_into_the_report_and_the_dataset(
    timeline: Timeline,
) -> None:
    """The timeline keeps what each model call cost (the fixture prices its third call at
    $0.125): the export's step, its report and its dataset record say so."""
    run = host_run(timeline, T_DARK)
    priced = [s for s in run.steps if s.cost_usd]
    assert [s.cost_usd for s in priced] == [0.125]
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(run))) as z:
        html = z.read("report.html").decode()
        steps = lines(z)
    assert 'data-field="cost">$0.1250' in html
    assert [s.cost_usd for s in steps if s.cost_usd] == [0.125]


def documented_lines(data: bytes) -> list[dataset.StepRecord]:
    """steps.jsonl's lines checked against the documented schema's fields (each property
    there and no other, the version its constant names) and parsed as that version."""
    schema = json.loads((ROOT / "docs" / "export" / "step.schema.json").read_text())
    found = []
    for line in bundle_lines(data):
        raw = json.loads(line)
        assert set(raw) == set(schema["properties"]) >= set(schema["required"])
        assert raw["schema_version"] == schema["properties"]["schema_version"]["const"]
        for key, ref in (
            ("flow", "FlowUseRecord"),
            ("previous_step", "JudgementRecord"),
            ("resumed_from", "ResumedRecord"),
        ):
            if raw[key] is not None:
                assert set(raw[key]) == set(schema["$defs"][ref]["properties"]), key
        record = dataset.parse_line(line)
        assert isinstance(record, dataset.StepRecord)
        found.append(record)
    return found


def test_steps_jsonl_carries_the_prompts_the_flow_and_the_models_own_verdict(
    timeline: Timeline,
) -> None:
    """amc.export.step/2 has what the report shows: each step's user prompt and the system
    prompt where it changes, the learned flow a step was replayed from or took over from (and
    why it diverged), and the model's verdict on its previous step. /1 had none of it."""
    run = host_run(timeline, T_DARK)
    assert len(run.steps) >= 3 and all(s.user_prompt and s.system_prompt for s in run.steps)
    run.steps[0].flow_id, run.steps[0].flow_step = "f1", 1
    run.steps[0].replay_divergence = "step 1 expects the launcher; the screen shows Settings"
    run.steps[1].flow_id, run.steps[1].flow_step = "f1", 2
    run.steps[2].previous_step = Judged("not met", "the Display page did not open")
    data = bundle_bytes(run)
    steps = documented_lines(data)
    assert [s.user_prompt for s in steps] == [s.user_prompt for s in run.steps]
    assert steps[0].system_prompt == run.steps[0].system_prompt
    assert all(s.system_prompt is None for s in steps[1:])  # unchanged: written once
    assert steps[0].flow is not None and steps[0].flow.divergence == run.steps[0].replay_divergence
    assert steps[1].flow == dataset.FlowUseRecord(
        flow_id="f1", flow_step=2, divergence=None, set_aside=None
    )
    assert all(s.flow is None for s in steps[2:])
    assert steps[2].previous_step == dataset.JudgementRecord(
        verdict="not met", note="the Display page did not open"
    )
    assert [s.previous_step is None for s in steps] == [True, True, False] + [True] * (
        len(steps) - 3
    )
    back = read_bundle(data)  # how --merge reads a host's export
    for a, b in zip(run.steps, back.steps, strict=True):
        assert (b.user_prompt, b.system_prompt) == (a.user_prompt, a.system_prompt)
        assert (b.flow_id, b.flow_step, b.replay_divergence) == (
            a.flow_id,
            a.flow_step,
            a.replay_divergence,
        )
        assert b.previous_step == a.previous_step
    html = render_report(run)
    assert html.count('data-field="flow"') == 2 and html.count('data-field="previous-step"') == 1


def test_a_replayed_step_says_it_was_replayed_without_the_model(timeline: Timeline) -> None:
    """A step replayed from a learned flow called no model: the report's Thinking line said
    "(no thinking)", as if a model had been called and wrote none. It says "replayed without the
    model", as the consoles do; a step the model decided keeps its word."""
    run = host_run(timeline, T_DARK)
    replayed = run.steps[0]
    replayed.planner_mode, replayed.flow_id, replayed.flow_step = "replay", "f1", 1
    replayed.thinking, replayed.thinking_kind = [], "none"
    replayed.user_prompt = replayed.system_prompt = ""
    decided = run.steps[1]
    decided.thinking, decided.thinking_kind = [], "none"
    html = render_report(run)
    sections = html.split('<section class="step"')[1:]
    assert len(sections) == len(run.steps)
    kind = 'data-field="thinking-kind">('
    assert f"{kind}replayed without the model)" in sections[0]
    assert "no thinking" not in sections[0]
    assert f"{kind}no thinking)" in sections[1]


def test_a_step_resumed_from_a_kept_answer_is_exported_as_resumed(tmp_path: Path) -> None:
    """A host's step whose decision went on from a model answer its session kept before a write
    failed (the provider sent no turn id) says so in every file of the export: its dataset line
    (`resumed_from`: turn id and position, against the documented schema), the report (marked,
    with where the answer is), and read back and merged. The step after it, which asked the
    model, is not marked. Before, the export dropped the mark: the resumed step's rationale
    read as an answer to its own request, and the video's caption did not say it either."""
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("kept", 1, "open Display", "emulator-5554")
        store.append_step(
            TimelineRecord(
                "kept",
                1,
                1,
                tool_name="tap",
                rationale="written for the earlier request",
                resumed_from={
                    "turn_id": "",
                    "position": 4,
                    "answered_at": "2026-03-04T05:06:07.089000+00:00",
                },
            )
        )
        store.append_step(TimelineRecord("kept", 1, 2, tool_name="tap", rationale="asked"))
        run = run_from_timeline(store, "kept", HOST)
    finally:
        store.close()
    assert run is not None
    mark = ResumedFrom("", 4, dt.datetime(2026, 3, 4, 5, 6, 7, 89_000, tzinfo=dt.UTC))
    assert [s.resumed_from for s in run.steps] == [mark, None]
    # The video's caption marks it too, and a long purpose leaves the verdict its line.
    long = dataclasses.replace(run.steps[0], purpose="open the display " * 20, verdict="met")
    resumed, asked = (caption(s, f"step {s.step_index}") for s in (long, run.steps[1]))
    assert resumed[1] == RESUMED_LINE and resumed[-1] == "verdict: met", resumed
    assert RESUMED_LINE not in asked
    data = bundle_bytes(run)
    steps = documented_lines(data)
    assert steps[0].resumed_from == dataset.ResumedRecord(
        turn_id="", position=4, answered_at="2026-03-04T05:06:07.089000+00:00"
    )
    assert steps[1].resumed_from is None
    back = read_bundle(data)  # how --merge reads a host's export
    assert [s.resumed_from for s in back.steps] == [mark, None]
    cloud = read_bundle(data)
    cloud.steps[0].resumed_from = None  # a cloud record without the mark takes the host's
    assert merge(cloud, back).steps[0].resumed_from == mark
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        html = z.read("report.html").decode()
    assert html.count('data-field="resumed"') == 1
    assert str(escape(mark.words())) in html and "answered at 2026-03-04 05:06:07 UTC" in html


def test_a_flow_set_aside_is_exported_as_set_aside(tmp_path: Path) -> None:
    """A step where a replay set its flow aside uncounted (a switch already on, the phone
    part-way through the flow, another language) had no field in steps.jsonl: the exports
    dropped the flow from the step, so the line and the report said no flow had a part in it.
    /4's `flow.set_aside` says why (no divergence), the report says so, and it reads back and
    merges."""
    why = "'Dark theme' LinearLayout is already on, so tapping it would undo what the flow does"
    store = TimelineStore(tmp_path / "db.sqlite3", tmp_path / "artifacts")
    try:
        store.start_task("sa", 1, "Turn on dark theme", "emulator-5554")
        for index, flow in enumerate(
            [
                {"flow_id": "f1", "flow_step": 1, "divergence": ""},
                {"flow_id": "f1", "flow_step": 2, "divergence": "", "set_aside": why},
            ],
            start=1,
        ):
            mode = "replay" if index == 1 else "compact"
            store.append_step(
                TimelineRecord("sa", 1, index, tool_name="tap", planner_mode=mode, flow=flow)
            )
        run = run_from_timeline(store, "sa", HOST)
    finally:
        store.close()
    assert run is not None
    assert [(s.flow_id, s.flow_step, s.flow_set_aside) for s in run.steps] == [
        ("f1", 1, ""),
        ("f1", 2, why),
    ]
    data = bundle_bytes(run)
    steps = documented_lines(data)
    assert steps[0].flow == dataset.FlowUseRecord(
        flow_id="f1", flow_step=1, divergence=None, set_aside=None
    )
    assert steps[1].flow == dataset.FlowUseRecord(
        flow_id="f1", flow_step=2, divergence=None, set_aside=why
    )
    back = read_bundle(data)  # how --merge reads a host's export
    assert back.steps[1].flow_set_aside == why
    cloud = read_bundle(data)
    cloud.steps[1].flow_set_aside = ""
    assert merge(cloud, back).steps[1].flow_set_aside == why
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        html = z.read("report.html").decode()
    assert f"set aside at its step 2: {escape(why)} (no divergence" in html


def test_an_export_written_as_step_3_still_reads(timeline: Timeline) -> None:
    """/3 is closed, not gone: a line written before /4 (its flow without `set_aside`) reads
    back; /3's schema stays documented."""
    documented = (ROOT / "docs" / "export" / "step-v3.schema.json").read_text()
    assert documented == dataset.schema_json(dataset.StepRecordV3)
    run = host_run(timeline, T_DARK)
    run.steps[0].flow_id, run.steps[0].flow_step = "f1", 1
    for line in bundle_lines(bundle_bytes(run)):
        raw = json.loads(line)
        raw["schema_version"] = "amc.export.step/3"
        if raw["flow"] is not None:
            del raw["flow"]["set_aside"]
        record = dataset.parse_line(json.dumps(raw))
        assert type(record) is dataset.StepRecordV3
        step = dataset.step_from_record(record)
        assert step.flow_set_aside == "" and step.user_prompt == record.user_prompt
    assert (
        dataset.step_from_record(dataset.parse_line(bundle_lines(bundle_bytes(run))[0])).flow_id
        == "f1"
    )


@pytest.mark.parametrize("at", ["2026-03-04T05:06:07", "yesterday"])
def test_a_resumed_line_whose_time_is_no_utc_time_is_refused_naming_it(at: str) -> None:
    """`answered_at` held any string: one without its offset was read as the reader's local
    time (the report showed another hour), one that is no time failed the read with a bare
    ValueError from deep in the reader. The line is refused, naming the field."""
    line = dataset.ResumedRecord(turn_id="", position=4, answered_at=None).model_dump()
    with pytest.raises(ValidationError, match="answered_at"):
        dataset.ResumedRecord.model_validate({**line, "answered_at": at})
    assert (
        dataset.ResumedRecord.model_validate(
            {**line, "answered_at": "2026-03-04T05:06:07+00:00"}
        ).answered_at
        == "2026-03-04T05:06:07+00:00"
    )


def test_an_export_written_as_step_2_still_reads(timeline: Timeline) -> None:
    """/2 is closed, not gone: a line written before /3 (no `resumed_from`) reads back, its
    step as one that asked the model; /2's schema stays documented."""
    documented = (ROOT / "docs" / "export" / "step-v2.schema.json").read_text()
    assert documented == dataset.schema_json(dataset.StepRecordV2)
    run = host_run(timeline, T_DARK)
    v2_fields = set(json.loads(documented)["properties"])
    for line in bundle_lines(bundle_bytes(run)):
        raw = {k: v for k, v in json.loads(line).items() if k in v2_fields}
        raw["schema_version"] = "amc.export.step/2"
        record = dataset.parse_line(json.dumps(raw))
        assert type(record) is dataset.StepRecordV2
        assert dataset.step_from_record(record).resumed_from is None
        assert dataset.step_from_record(record).user_prompt == record.user_prompt


def test_an_export_written_as_step_1_still_reads_and_merges(timeline: Timeline) -> None:
    """/1 is closed, not gone: an export written before /2 reads back (its prompts, flow and
    judgement as none recorded) and merges; /1's schema stays documented."""
    documented = (ROOT / "docs" / "export" / "step-v1.schema.json").read_text()
    assert documented == dataset.schema_json(dataset.StepRecordV1)
    run = host_run(timeline, T_DARK)
    good = bundle_bytes(run)
    v1_fields = set(json.loads(documented)["properties"])
    old = []
    for line in bundle_lines(good):
        raw = {k: v for k, v in json.loads(line).items() if k in v1_fields}
        raw["schema_version"] = "amc.export.step/1"
        old.append(json.dumps(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as z, zipfile.ZipFile(out, "w") as w:
        for name in z.namelist():
            w.writestr(name, "\n".join(old) + "\n" if name == "steps.jsonl" else z.read(name))
    back = read_bundle(out.getvalue())
    assert isinstance(dataset.parse_line(old[0]), dataset.StepRecordV1)
    assert [s.key for s in back.steps] == [s.key for s in run.steps]
    assert all(s.user_prompt == s.system_prompt == "" for s in back.steps)
    merged = merge(run, back)
    assert [s.user_prompt for s in merged.steps] == [s.user_prompt for s in run.steps]


def test_run_2_lists_the_failed_calls_and_a_run_1_export_still_reads_and_merges(
    timeline: Timeline,
) -> None:
    """run.json (since /2): /1's fields plus what failed decisions' billed calls cost
    per attempt and the run's total (the steps' and theirs). /1 is closed, not gone: its
    run.json reads back (no failed calls listed). Merged, an attempt takes the record that
    counts more failed decisions (a host's outbox may hold some the cloud has not counted)."""
    run = host_run(timeline, T_DARK)
    run.failed_calls = [FailedCalls(1, 2, Usage(400, 60, cost_usd=0.25))]
    steps, cost = Usage(), 0.0
    for s in run.steps:
        assert s.usage is not None and s.cost_usd is not None
        steps.add(s.usage)
        cost += s.cost_usd
    good = bundle_bytes(run)
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        head = dataset.parse_run(z.read("run.json"))
    assert isinstance(head, dataset.RunRecord) and head.schema_version == "amc.export.run/4"
    ((f),) = head.failed_calls
    assert (f.attempt, f.decisions, f.usage.input_tokens, f.cost_usd) == (1, 2, 400, 0.25)
    total = head.total.usage
    assert (total.input_tokens, total.output_tokens) == (
        steps.input_tokens + 400,
        steps.output_tokens + 60,
    )
    assert head.total.cost_usd == pytest.approx(cost + 0.25)
    assert read_bundle(good).failed_calls == run.failed_calls

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as z, zipfile.ZipFile(out, "w") as w:
        for name in z.namelist():
            body = z.read(name)
            if name == "run.json":
                raw = json.loads(body)
                raw = {k: v for k, v in raw.items() if k in dataset.RunRecordV1.model_fields}
                body = json.dumps({**raw, "schema_version": "amc.export.run/1"}).encode()
            w.writestr(name, body)
    back = read_bundle(out.getvalue())
    assert back.failed_calls == [] and [s.key for s in back.steps] == [s.key for s in run.steps]
    fewer = [FailedCalls(1, 1, Usage(100)), FailedCalls(2, 1, Usage(7))]
    cloud = Run(run.task_id, run.goal, run.status, run.result, origin="cloud", failed_calls=fewer)
    assert merge(cloud, back).failed_calls == fewer
    assert merge(cloud, run).failed_calls == [run.failed_calls[0], fewer[1]]


def test_run_3_says_what_the_retention_pruned_and_a_run_2_export_still_reads(
    timeline: Timeline,
) -> None:
    """run.json is amc.export.run/3: /2's fields plus what the cloud's retention deleted of the
    log (decisions, failed decisions' call records, when, what they cost), counted in the
    run's total, and the report says so. A merge keeps the cloud's record (a host's export
    knows nothing of it). /2 is closed, not gone: its run.json reads back, nothing pruned."""
    run = host_run(timeline, T_DARK)
    steps_usage, _ = run.total()
    at = dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.UTC)
    run.pruned = Pruned(3, 1, at, Usage(1800, 300, cost_usd=0.5))
    good = bundle_bytes(run)
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        head = dataset.parse_run(z.read("run.json"))
        report = z.read("report.html").decode()
    assert isinstance(head, dataset.RunRecord) and head.schema_version == "amc.export.run/4"
    assert head.pruned is not None
    assert (head.pruned.decisions, head.pruned.failed_decisions) == (3, 1)
    assert head.pruned.pruned_at == "2026-12-05T10:00:00+00:00"
    assert (head.pruned.usage.input_tokens, head.pruned.cost_usd) == (1800, 0.5)
    assert head.total.usage.input_tokens == steps_usage.input_tokens + 1800
    assert head.total.cost_usd == pytest.approx(steps_usage.cost_usd + 0.5)
    assert read_bundle(good).pruned == run.pruned
    assert (
        '<dd data-field="pruned">3 decisions and 1 failed decision\'s call records deleted by '
        "the cloud's retention on 2026-12-05 10:00 UTC (no step is recorded for them), which "
        "took 1800 in · 300 out · $0.5000</dd>"
    ) in report.replace("&#39;", "'")

    cloud = Run(run.task_id, run.goal, run.status, run.result, origin="cloud", pruned=run.pruned)
    host = read_bundle(good)
    host.pruned = None
    assert merge(cloud, host).pruned == run.pruned

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as z, zipfile.ZipFile(out, "w") as w:
        for name in z.namelist():
            body = z.read(name)
            if name == "run.json":
                raw = json.loads(body)
                raw = {k: v for k, v in raw.items() if k in dataset.RunRecordV2.model_fields}
                body = json.dumps({**raw, "schema_version": "amc.export.run/2"}).encode()
            w.writestr(name, body)
    back = read_bundle(out.getvalue())
    assert back.pruned is None and [s.key for s in back.steps] == [s.key for s in run.steps]
