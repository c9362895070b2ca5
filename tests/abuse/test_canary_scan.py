"""Canary scan: a real run with a known API key and a secret typed as `sensitive`, then a search
of everything the run wrote for either value.

The embedded stack (cloud over mTLS with its SQLite file, host with OCR and its timeline store,
the virtual phone over the adb protocol) runs with the planner on the cloud transport against the
local fake Anthropic server: `AMC_PLANNER_PROVIDER=anthropic`, a canary key the fake *requires*
(it refuses any other, so the key is provably used on the wire), and a script that opens
Contacts, taps "Create contact" and types the canary secret into the Name field with
`sensitive: true`. Name is not a password field, so the phone then shows the secret on screen:
the host must keep it out of later scenes, OCR, screenshots and prompts too. The task also
carries a secret parameter (`SubmitTaskRequest.secrets`, encrypted with the embedded stack's
key) that the goal names as `{{secret:contact_phone}}`; the model writes that reference into
the Phone field and the host types the value.

Proves, on both planner transports: neither the key, the secret nor the secret parameter's value
is found in any file the run produced (cloud SQLite with its WAL and its artifact store of step
screenshots, host timeline SQLite, outbox and screenshot artifacts, the captured logs of every
logger at DEBUG, and every file of the run's exports — the host's, the cloud's and the merged one:
report, video, dataset, screenshots), as raw UTF-8, UTF-16 (both byte orders), base64 (every
alignment) or percent-encoding, nor in the text OCR reads back from any stored or exported
screenshot; the model's requests carry the parameter's name, never its value; the parameter is
gone from the cloud once the task ended; and the cloud database holds no PNG/JPEG bytes (raw or
base64).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import secrets
import sqlite3
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import tesserocr
from PIL import Image
from rich.console import Console

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    fleet_service_pb2,
    task_service_pb2,
    types_pb2,
)
from console.embedded import HOST_ID, embedded_stack, follow_tasks
from console.exporting import cloud_run
from console.gateway.cloud import CloudClient
from export.bundle import bundle_bytes, read_bundle
from export.merge import merge
from host.perception.hierarchy import parse_scene
from host.perception.ocr import default_tessdata_path
from host.timeline.export_source import run_from_timeline
from host.timeline.store import TimelineStore
from telemetry import logs
from tests.support.fakes import FakeModelServer, anthropic_message, text, tool_use

KEY = f"sk-ant-canary-{secrets.token_hex(12)}"
SECRET = f"Zq{secrets.randbelow(10**6):06d}Canary"
#: The secret parameter's value: only the phone may ever hold it.
PARAM = f"Kx{secrets.randbelow(10**6):06d}Param"
REFERENCE = "{{secret:contact_phone}}"

IMAGE_MAGIC = {
    "PNG": b"\x89PNG\r\n\x1a\n",
    "PNG (base64)": b"iVBORw0KGgo",
    "JPEG": b"\xff\xd8\xff",
    "JPEG (base64)": b"/9j/",
}


def encodings(value: str) -> dict[str, bytes]:
    """The byte forms a leak could take: raw, UTF-16, percent-encoded, base64 at each alignment."""
    raw = value.encode()
    forms = {
        "utf-8": raw,
        "utf-16-le": value.encode("utf-16-le"),
        "utf-16-be": value.encode("utf-16-be"),
        "percent": urllib.parse.quote(value, safe="").encode(),
    }
    for pad in range(3):
        encoded = base64.b64encode(b"\x00" * pad + raw)
        # Drop the characters that depend on the neighbouring bytes at either end.
        core = encoded[4 if pad else 0 : -4]
        forms[f"base64+{pad}"] = core
        forms[f"base64url+{pad}"] = base64.urlsafe_b64encode(b"\x00" * pad + raw)[
            4 if pad else 0 : -4
        ]
    return forms


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
        elif root.is_dir():
            yield from (p for p in sorted(root.rglob("*")) if p.is_file())


@pytest.fixture
def canary_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key=KEY) as fake:
        for name in list(__import__("os").environ):
            if name.startswith(("AMC_PLANNER_", "ANTHROPIC_", "OPENAI_", "AI_PLANNER_")):
                monkeypatch.delenv(name)
        monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
        monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
        yield fake


def _script(fake: FakeModelServer) -> None:
    intent = {"purpose": "p", "expected_outcome": "e"}
    fake.script_anthropic(
        anthropic_message(
            text("Open Contacts."),
            tool_use(
                "launch_app",
                {
                    "package_name": "com.android.contacts",
                    "purpose": "open contacts",
                    "expected_outcome": "contacts list",
                },
            ),
        ),
        anthropic_message(
            text("Create one."),
            tool_use("tap", {"element_id": CREATE, **intent}),
        ),
        anthropic_message(
            text("Type the secret."),
            tool_use(
                "input_text",
                {"text": SECRET, "sensitive": True, "element_id": NAME_FIELD, **intent},
            ),
        ),
        anthropic_message(
            text("Now the phone number the task carries as a secret."),
            tool_use("input_text", {"text": REFERENCE, "element_id": PHONE_FIELD, **intent}),
        ),
        anthropic_message(
            text("Typed."),
            tool_use("complete", {"success": True, "reason": "the secret is typed"}),
        ),
    )


Box = tuple[int, int, int, int]


def _probe() -> tuple[str, str, Box, str, Box]:
    """Ids of "Create contact", the Name and the Phone fields as the host numbers them (its
    perception: the on-screen keyboard is an element too), and the fields' boxes (inset past
    their borders), read off a probe phone in the same state."""
    from host.devices.virtual.driver import VirtualDriver
    from host.devices.virtual.phone import VirtualPhone
    from host.perception.perceive import Perceiver

    phone = VirtualPhone("probe")
    perceiver = Perceiver(None, retry_delay_s=0)
    phone.launch("com.android.contacts")
    scene = perceiver.perceive(VirtualDriver(phone), with_ocr=False).scene
    create = next(e for e in scene.elements if e.content_desc == "Create contact")
    b = create.bounds
    phone.tap((b.left + b.right) // 2, (b.top + b.bottom) // 2)
    form = perceiver.perceive(VirtualDriver(phone), with_ocr=False).scene
    name = next(e for e in form.elements if e.resource_id.endswith("/name"))
    number = next(e for e in form.elements if e.resource_id.endswith("/phone"))
    n, p = name.bounds, number.bounds
    return (
        create.element_id,
        name.element_id,
        (n.left + 20, n.top + 20, n.right - 20, n.bottom - 20),
        number.element_id,
        (p.left + 20, p.top + 20, p.right - 20, p.bottom - 20),
    )


CREATE, NAME_FIELD, NAME_BOX, PHONE_FIELD, PHONE_BOX = _probe()


def _read_line(api: Any, png: bytes, box: tuple[int, int, int, int]) -> str:
    """OCR of one text line inside `box` (a field's inside), spaces removed."""
    image = Image.open(io.BytesIO(png)).convert("L").crop(box)
    api.SetImage(image)
    return str(api.GetUTF8Text()).replace(" ", "").strip()


async def _shipped(stack: Any, task_id: str, count: int) -> Any:
    """The direct transport's decisions arrive from the host's outbox in the background: wait
    until `count` are logged and the host reports its outbox empty."""
    artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(stack.operator.channel)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        decisions = await stack.operator.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        shots = await artifacts.ListStepScreenshots(
            artifact_service_pb2.ListStepScreenshotsRequest(task_id=task_id)
        )
        hosts = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
        empty = all(h.HasField("outbox") and not h.outbox.items for h in hosts.hosts)
        if len(decisions.decisions) == count and len(shots.screenshots) == 2 * count and empty:
            return decisions
        assert loop.time() < deadline, f"not shipped: {decisions} {hosts}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("transport", ["cloud", "direct"])
@pytest.mark.parametrize("mode", ["compact", "session"])
async def test_canary_key_and_secret_leave_no_trace(
    canary_env: FakeModelServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    transport: Literal["cloud", "direct"],
) -> None:
    """In session mode the cloud also stores the whole conversation (planner_session_items):
    the scan covers it, since the model's input_text call and every later observation are in
    there. On the direct transport the host calls the model and keeps the conversation itself,
    and ships its decisions and screenshots to the cloud from its outbox: the scan covers the
    outbox, the shipped decisions and the cloud's artifact store too."""
    monkeypatch.setenv("AMC_PLANNER_MODE", mode)
    monkeypatch.setenv("AMC_PLANNER_SESSION_STREAM", "false")  # this fake answers whole messages
    fake = canary_env
    _script(fake)
    data_dir = tmp_path / "stack"
    log_file = tmp_path / "run.log"
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    # The structured logs too: the JSON lines (with every bound field and the trace ids) and
    # the readable ones with their context suffix.
    json_lines = (tmp_path / "run.jsonl").open("w", encoding="utf-8")
    text_lines = (tmp_path / "run-text.log").open("w", encoding="utf-8")
    structured = [logs.handler("json", json_lines), logs.handler("text", text_lines)]
    root = logging.getLogger()
    old_level = root.level
    for h in (handler, *structured):
        root.addHandler(h)
    root.setLevel(logging.DEBUG)
    try:
        async with embedded_stack(data_dir, transport=transport) as stack:
            submitted = await stack.operator.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal=f"Create a contact with the secret name and the phone {REFERENCE}",
                    secrets={"contact_phone": PARAM},
                )
            )
            task_id = submitted.task.task_id
            final = await follow_tasks(stack.operator, [task_id], Console(file=None), 30)
            task = final[task_id]
            decisions = await _shipped(stack, task_id, 5)
            phone = next(iter(stack.adb.phones.values()))
            live_screen = phone.screenshot_png()
            exports = await _export_everything(
                stack.cloud_address, stack.pki_dir, data_dir, task_id
            )
            typed = [e.text for e in parse_scene(phone.dump_hierarchy(), None, None).elements]
            await _until_no_secret_rows(data_dir / "cloud.sqlite3")
    finally:
        for h in (handler, *structured):
            root.removeHandler(h)
        root.setLevel(old_level)
        handler.close()
        json_lines.close()
        text_lines.close()
    assert "task_id" in (tmp_path / "run.jsonl").read_text(), "the structured logs were written"

    # The run really happened, through the fake, with the canary key, and typed the secret.
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.result_summary
    assert fake.pending == 0, "the scripted model answers were not all used"
    assert fake.requests
    for r in fake.requests:  # the fake answers 401 to any other key
        assert KEY in (r.headers.get("x-api-key"), r.headers.get("authorization", "")[7:])
        assert r.status == 200
    assert [d.tool_name for d in decisions.decisions] == [
        "launch_app",
        "tap",
        "input_text",
        "input_text",
        "complete",
    ]
    assert SECRET in typed, "the phone's Name field should hold the secret"
    assert PARAM in typed, "the phone's Phone field should hold the secret parameter's value"
    assert REFERENCE in decisions.decisions[3].arguments_json  # the log keeps the name
    sent = json.dumps([r.body for r in fake.requests], ensure_ascii=False)
    assert REFERENCE in sent and PARAM not in sent  # the model saw the name, never the value

    # 1. Byte scan of every file the run produced, and the captured logs; the exports are
    # unpacked first (a zip's deflated members would hide a value from a byte scan).
    export_dir = tmp_path / "exports"
    for name, data in exports.items():
        (export_dir / name).mkdir(parents=True)
        (export_dir / name / "export.zip").write_bytes(data)
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            z.extractall(export_dir / name)
    exported = list(files_under(export_dir))
    assert {p.name for p in exported} >= {"report.html", "run.gif", "run.mp4", "steps.jsonl"}
    typed = [
        line
        for line in (export_dir / "merged" / "steps.jsonl").read_text().splitlines()
        if '"input_text"' in line
    ]
    assert typed and all(
        '"text":"•••"' in line or f'"text":"{REFERENCE}"' in line for line in typed
    ), typed
    produced = (
        list(files_under(data_dir, log_file, tmp_path / "run.jsonl", tmp_path / "run-text.log"))
        + exported
    )
    assert any(p.name == "cloud.sqlite3" for p in produced)
    cloud_db = next(p for p in produced if p.name == "cloud.sqlite3")
    with sqlite3.connect(cloud_db) as db:
        (items,) = db.execute("SELECT COUNT(*) FROM planner_session_items").fetchone()
    kept_by_cloud = mode == "session" and transport == "cloud"
    assert (items > 0) == kept_by_cloud, "the cloud keeps the conversation (only) then"
    expected = (
        types_pb2.PLANNER_TRANSPORT_CLOUD
        if transport == "cloud"
        else (types_pb2.PLANNER_TRANSPORT_DIRECT)
    )
    assert {d.planner_transport for d in decisions.decisions} == {expected}
    assert any(p.parent.parent.parent.name == "cloud-artifacts" for p in produced), (
        "no screenshot reached the cloud's artifact store"
    )
    assert any(p.suffix == ".png" for p in produced), "no screenshots were stored"
    leaks = []
    for path in produced:
        if path.parent.name == "pki":
            continue  # certificates: no planner data goes there
        blob = path.read_bytes()
        for label, value in (("API key", KEY), ("secret", SECRET), ("secret parameter", PARAM)):
            for form, needle in encodings(value).items():
                if needle and needle in blob:
                    leaks.append(f"{label} ({form}) in {path.relative_to(tmp_path)}")
    assert not leaks, leaks

    # 2. No screenshot bytes in the cloud database (the planner sees them, never stores them).
    for path in produced:
        if path.name.startswith("cloud.sqlite3"):
            blob = path.read_bytes()
            found = [name for name, magic in IMAGE_MAGIC.items() if magic in blob]
            assert not found, f"{found} in {path.name}"

    # 3. What the pixels say: OCR the Name and Phone fields' boxes on every stored screenshot.
    # Positive control first: the same OCR reads each value off the phone's live screen, so its
    # absence from the stored ones means the host painted it over.
    with tesserocr.PyTessBaseAPI(
        path=str(default_tessdata_path()), psm=tesserocr.PSM.SINGLE_LINE
    ) as api:
        # The word at each value's end is the control: OCR reads it reliably, while the random
        # digits are sometimes misread ("770015" as "/7/0015") and the "Zq" prefix as digits.
        seen_live = _read_line(api, live_screen, NAME_BOX)
        assert SECRET[8:] in seen_live, (
            f"OCR cannot read the secret on the live screen: {seen_live!r}"
        )
        seen_param = _read_line(api, live_screen, PHONE_BOX)
        assert PARAM[8:] in seen_param, f"OCR cannot read the parameter live: {seen_param!r}"
        shown = []
        screenshots = [p for p in produced if p.suffix == ".png"]
        assert any(p.is_relative_to(export_dir) for p in screenshots), "no exported screenshot"
        for path in screenshots:
            for value, box in ((SECRET, NAME_BOX), (PARAM, PHONE_BOX)):
                seen = _read_line(api, path.read_bytes(), box)
                if value[2:8] in seen or value[8:] in seen:  # its digits, or its word
                    shown.append(f"{path.relative_to(tmp_path)}: {seen!r}")
        assert not shown, f"secret readable in stored screenshots: {shown}"


async def _until_no_secret_rows(cloud_db: Path) -> None:
    """The task ended: the cloud's next sweep deletes its secret parameters (sealed or not)."""
    for _ in range(200):
        with sqlite3.connect(cloud_db) as db:
            (left,) = db.execute("SELECT COUNT(*) FROM task_secrets").fetchone()
        if not left:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the task's secret parameters outlived it")


async def _export_everything(
    cloud_address: str, pki_dir: Path, data_dir: Path, task_id: str
) -> dict[str, bytes]:
    """The run's three exports: the host's (from its timeline), the cloud's, and the merge."""
    store = TimelineStore(
        data_dir / "host" / "task_progress.sqlite3", data_dir / "host" / "artifacts"
    )
    try:
        host = run_from_timeline(store, task_id, HOST_ID)
    finally:
        store.close()
    assert host is not None
    cloud_client = CloudClient(
        cloud_address,
        ca=pki_dir / "ca.pem",
        cert=pki_dir / "operator-admin.pem",
        key=pki_dir / "operator-admin.key",
    )
    try:
        cloud = await cloud_run(cloud_client, task_id, cloud_client)
    finally:
        await cloud_client.close()
    host_zip = await asyncio.to_thread(bundle_bytes, host)
    cloud_zip = await asyncio.to_thread(bundle_bytes, cloud)
    merged = merge(await asyncio.to_thread(read_bundle, cloud_zip), read_bundle(host_zip))
    return {
        "host": host_zip,
        "cloud": cloud_zip,
        "merged": await asyncio.to_thread(bundle_bytes, merged),
    }


@pytest.mark.parametrize("prefix", [b"", b"x", b"xy", b'{"text": "'])
def test_the_scan_finds_planted_values(prefix: bytes) -> None:
    """The scanner's own positive control: every encoding of a planted value is found."""
    raw = prefix + SECRET.encode() + b'", "more": 1}'
    planted = [
        raw,
        (prefix.decode() + SECRET).encode("utf-16-le"),
        (prefix.decode() + SECRET).encode("utf-16-be"),
        base64.b64encode(raw),
        base64.urlsafe_b64encode(raw),
        urllib.parse.quote(raw.decode(), safe="").encode(),
    ]
    forms = encodings(SECRET).values()
    for blob in planted:
        assert any(needle in blob for needle in forms), blob
