"""The Node.js example host (examples/node-host/host.js) completes "Turn on dark theme".

Real parts: `amc cloud serve` as a separate process (SQLite, mTLS, offline planner), a virtual
phone served over the adb protocol, and the Node host speaking gRPC (grpc-js, protos loaded from
proto/ at run time) and adb (@devicefarmer/adbkit). The host sends typed observations of the
dumps it parsed itself and the outcomes of its actions; the cloud builds every prompt.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import (
    decision_log_service_pb2,
    fleet_service_pb2,
    flow_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud.store.leases import RESULT_SUMMARY_LIMIT, SUMMARY_LIMIT
from host.devices.virtual.apps.base import PhoneApi
from host.devices.virtual.apps.notes import PKG as NOTES
from host.devices.virtual.apps.stub import StubApp
from host.devices.virtual.layout import Node
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.state import Note, Page
from host.devices.virtual.widgets import PAD, TOOLBAR_H, Geometry
from host.perception.hierarchy import parse_scene
from planner.observation import (
    MAX_ACTIVITY_BYTES,
    MAX_ELEMENTS,
    MAX_NAME_BYTES,
    MAX_OBSERVATION_BYTES,
    MAX_OMITTED,
    MAX_TEXT_BYTES,
    MAX_TREE_MISSING_BYTES,
)
from planner.scene import Element
from planner.steps import MAX_DRIVER_OUTPUT_BYTES, MAX_OUTCOME_ERROR_BYTES
from tests.node.rig import HOST, Rig, cloud_and_phone, dark_theme_task, start_host
from tests.support.fakes import ANTHROPIC_KEY, FakeModelServer, anthropic_message, tool_use
from tests.support.processes import wait_task

ROOT = Path(__file__).resolve().parents[2]
HOST_ID = "node-1"


@pytest.fixture
def node() -> str:
    found = shutil.which("node")
    if found is None or not (ROOT / "node_modules" / "@devicefarmer" / "adbkit").exists():
        pytest.fail("node and `npm ci` (node_modules/@devicefarmer/adbkit) are required")
    return found


async def _run_node(node: str, rig: Rig) -> str:
    """One Node host process running one task to its end; returns what it said."""
    host = await start_host(node, rig, HOST_ID, rig.pki.parent / "host-data")
    try:
        _, err = await asyncio.wait_for(host.communicate(), 240)
    finally:
        if host.returncode is None:
            host.kill()
            await host.wait()
    said = err.decode()
    assert host.returncode == 0, said
    return said


async def _one_task(
    node: str, tmp_path: Path, phone: VirtualPhone, goal: str
) -> tuple[str, types_pb2.Task, list[types_pb2.Decision]]:
    """One task of `goal` (one attempt) run by the Node host on `phone` to its end: what the
    host said, the task as it ended, and its decisions with the observations they were made on."""
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task = (
            await rig.client.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(goal=goal, max_attempts=1), timeout=10
            )
        ).task
        said = await _run_node(node, rig)
        final = await wait_task(
            rig.client, task.task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
        )
        decisions = (
            await rig.client.decisions.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=task.task_id, include_observation=True
                ),
                timeout=10,
            )
        ).decisions
    return said, final, list(decisions)


async def _first_look(
    node: str, tmp_path: Path, phone: VirtualPhone, fields: Callable[[Any], tuple[Any, ...]]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """`fields` of each element the Node host showed the model at its first step, and of each
    element the Python host keeps (host/perception) of the same screen's dump: the two hosts
    must show the model the same screen."""
    kept = parse_scene(phone.dump_hierarchy(), package=phone.current_package()).elements
    expected = [fields(e) for e in kept]
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")
    assert decisions, said
    return [fields(e) for e in decisions[0].observation.elements], expected


async def test_the_node_host_turns_on_dark_theme(node: str, tmp_path: Path) -> None:
    phone = VirtualPhone("emulator-5554")
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await dark_theme_task(rig.client)
        said = await _run_node(node, rig)
        final = await wait_task(
            rig.client, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED, 10
        )
        decisions = (
            await rig.client.decisions.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=task_id), timeout=10
            )
        ).decisions
        assert phone.state.flag("dark_theme"), said

        # The same goal again on a fresh phone: the cloud learned the first run as a flow and
        # replays it inside Decide; the Node host executes replayed steps like any decision.
        for _ in range(200):
            flows = (await rig.client.flows.ListFlows(flow_service_pb2.ListFlowsRequest())).flows
            if flows:
                break
            await asyncio.sleep(0.1)
        assert flows, "the cloud learned no flow from the first run"
        phone.reset()
        again_id = await dark_theme_task(rig.client)
        await _run_node(node, rig)
        await wait_task(
            rig.client, again_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED, 10
        )
        replayed = (
            await rig.client.decisions.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=again_id), timeout=10
            )
        ).decisions

    assert phone.state.flag("dark_theme")
    assert {d.mode for d in replayed} == {types_pb2.PLANNER_MODE_REPLAY}
    assert all(d.flow_id == flows[0].flow_id for d in replayed)
    assert final.host_id == HOST_ID
    assert final.progress.max_steps == 30  # "step N of at most 30", from the Node host
    assert len(decisions) >= 3
    assert decisions[-1].tool_name == "complete"
    assert {d.mode for d in decisions} == {types_pb2.PLANNER_MODE_COMPACT}
    # The host sent no prompt: the cloud built each from the task's goal and its own log, with
    # the outcome the host reported for every executed step.
    assert all('"Turn on dark theme"' in d.user_prompt for d in decisions)
    assert all(d.HasField("outcome") and d.outcome.executed for d in decisions[:-1])
    # It runs no checker: the cloud checked each step on the next observation itself.
    assert all(d.verification.checked_by_cloud for d in decisions[:-1])
    assert decisions[0].tool_name == "tap"
    assert decisions[0].outcome.driver_output.startswith("tapped (")  # what adb shell input did
    assert "TASK_STATUS_SUCCEEDED" in said


async def test_the_node_host_cuts_long_text_by_utf8_bytes_on_a_character_boundary(
    node: str, tmp_path: Path
) -> None:
    """The contract's limits on what Decide reads are UTF-8 bytes, and a JavaScript string
    counts UTF-16 units: the Node host cut an element's text at 1,000 units whatever it held
    (its error and driver output at 2,000 and 4,000, which non-ASCII text takes past their
    2,048 and 4,096 bytes: refused), here through the middle of an emoji, which reached the
    model and the log as U+FFFD. Texts are now cut by bytes, on a character boundary, to each
    field's limit (4,096 bytes for an element's text)."""
    phone = VirtualPhone("emulator-5554")
    title = "a" + "😀" * 1500  # 6,001 bytes, 3,001 UTF-16 units
    phone.state.notes.append(Note(title=title, body="Ж" * 3000))
    assert phone.launch(NOTES)
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    texts = [e.text for e in decisions[0].observation.elements]
    shown = next(t for t in texts if t.startswith("a😀"))
    assert shown == "a" + "😀" * 1023  # 4,093 bytes: one more emoji would pass 4,096
    assert "Ж" * 2048 in texts  # 4,096 bytes exactly


class _LongNamedApp(StubApp):
    """An app whose package, activity and a view's class are longer than the contract takes
    (an app generated with a long obfuscated name, seen in real dumps), titled in emoji."""

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del phone, page
        top = geo.top + TOOLBAR_H
        return [
            Node(
                "android.widget.TextView",
                (PAD, geo.top, geo.width - PAD, top),
                text=self.label,
                resource_id="android:id/action_bar_title",
            ),
            Node(
                "com.example.widgets." + "W" * 300,
                (PAD, top + 120, geo.width - PAD, top + 240),
                text="Continue",
                resource_id=f"{self.package}:id/next",
                clickable=True,
            ),
        ]


async def test_the_node_host_cuts_every_limited_field_to_the_contracts_limit(
    node: str, tmp_path: Path
) -> None:
    """The Node host cut no name at all (an element's resource id, class and package, the
    foreground package and activity): a phone showing an app with a name past 256 bytes had
    every step refused (INVALID_ARGUMENT "…package_name is N bytes; at most 256"). And it cut
    its progress summary by UTF-16 units, through an emoji the cloud then stored as U+FFFD.
    Each is now cut to the limit the contract gives it, whole characters only."""
    phone = VirtualPhone("emulator-5554")
    package = "com.example." + "a" * 300
    activity = package + ".MainActivity"
    phone.apps[package] = _LongNamedApp(package, "😀" * 150, activity, (30, 142, 62))
    assert phone.launch(package)
    said, final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    seen = decisions[0].observation
    assert seen.foreground_package == package[:256]
    assert seen.foreground_activity == f"{package}/{activity}"[:512]
    mine = [e for e in seen.elements if e.package_name.startswith("com.example.")]
    assert mine and all(e.package_name == package[:256] for e in mine)
    assert f"{package}:id/next"[:256] in {e.resource_id for e in mine}
    assert "com.example.widgets." + "W" * 236 in {e.class_name for e in mine}
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    # 168 characters (the cloud's limit is 200), 318 UTF-16 units: whole, no U+FFFD.
    assert final.progress.summary == "left it; now on '" + "😀" * 150 + "'"


class _BusyApp(StubApp):
    """A screen with more to read than the contract takes (a long chat, a feed): `rows` lines of
    text, each `width` characters, above the one button that matters, last in the dump."""

    def __init__(self, package: str, rows: int, width: int) -> None:
        super().__init__(package, "Busy", package + ".MainActivity", (30, 142, 62))
        self.rows = rows
        self.width = width

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del phone, page
        top = geo.top + TOOLBAR_H
        return [
            *(
                Node(
                    "android.widget.TextView",
                    (PAD, top + i % 1000, geo.width - PAD, top + i % 1000 + 40),
                    text=f"line {i} ".ljust(self.width, "x"),
                )
                for i in range(self.rows)
            ),
            Node(
                "android.widget.Button",
                (PAD, geo.bottom - 200, geo.width - PAD, geo.bottom - 80),
                text="Continue",
                resource_id=f"{self.package}:id/next",
                clickable=True,
            ),
        ]


@pytest.mark.parametrize(
    ("rows", "width"),
    [(1500, 20), (600, 4000)],
    ids=["more-elements-than-1000", "more-than-1-MiB"],
)
async def test_the_node_host_keeps_a_busy_screen_within_the_contracts_bounds(
    node: str, tmp_path: Path, rows: int, width: int
) -> None:
    """The Node host sent every element it found, however many and however long: a screen with
    more than 1,000 of them, or more than 1 MiB serialized, had every step refused
    (INVALID_ARGUMENT "observation.elements: 1501 elements; at most 1000") and the task failed
    at step 1. It now keeps what the Python host keeps: what a finger can use first, then the
    texts in the dump's order, while they fit, sent in the dump's order and counted in
    `omitted_elements`."""
    phone = VirtualPhone("emulator-5554")
    package = "com.example.busy"
    phone.apps[package] = _BusyApp(package, rows, width)
    assert phone.launch(package)
    said, final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    seen = decisions[0].observation
    assert len(seen.elements) <= MAX_ELEMENTS
    assert seen.ByteSize() <= MAX_OBSERVATION_BYTES
    assert "Continue" in [e.text for e in seen.elements]  # what a finger can use, kept first
    lines = [int(e.text.split()[1]) for e in seen.elements if e.text.startswith("line ")]
    assert lines == list(range(len(lines)))  # then the texts, in the dump's order
    assert seen.omitted_elements == rows - len(lines) > 0  # only lines of text were left out
    assert [e.element_id for e in seen.elements] == [f"e{i + 1}" for i in range(len(seen.elements))]


def test_the_node_hosts_limits_are_the_clouds() -> None:
    """The Node host keeps its own copy of the contract's limits (it is built from proto/
    alone); each must be the one the cloud checks or cuts to, or a host copied from it has its
    steps refused (a limit above the cloud's) or cuts what the cloud would keep."""
    source = HOST.read_text(encoding="utf-8")
    block = re.search(r"^const LIMITS = \{(.*?)^\};", source, re.S | re.M)
    assert block is not None, "host.js keeps its limits in `const LIMITS = {…};`"
    limits = {name: int(n) for name, n in re.findall(r"^\s*(\w+): (\d+),", block[1], re.M)}
    assert limits == {
        "text": MAX_TEXT_BYTES,
        "name": MAX_NAME_BYTES,
        "activity": MAX_ACTIVITY_BYTES,
        "error": MAX_OUTCOME_ERROR_BYTES,
        "driver_output": MAX_DRIVER_OUTPUT_BYTES,
        "summary": SUMMARY_LIMIT,
        "result_summary": RESULT_SUMMARY_LIMIT,
        "elements": MAX_ELEMENTS,
        "observation": MAX_OBSERVATION_BYTES,
        "omitted": MAX_OMITTED,
        "tree_missing": MAX_TREE_MISSING_BYTES,
    }


class _FormApp(StubApp):
    """A form as real dumps show it: an empty AutoCompleteTextView (a search or address field,
    neither clickable nor labelled until tapped), a view laid out but hidden from the user, and
    the one button that matters."""

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del phone, page
        top = geo.top + TOOLBAR_H
        return [
            Node(
                "android.widget.TextView",
                (PAD, geo.top, geo.width - PAD, top),
                text=self.label,
                resource_id="android:id/action_bar_title",
            ),
            Node(
                "android.widget.AutoCompleteTextView",
                (PAD, top + 40, geo.width - PAD, top + 160),
                resource_id=f"{self.package}:id/city",
                hint="City",
            ),
            Node(
                "android.widget.TextView",
                (PAD, top + 200, geo.width - PAD, top + 260),
                text="Hidden hint",
                resource_id=f"{self.package}:id/hidden",
            ),
            Node(
                "android.widget.Button",
                (PAD, top + 320, geo.width - PAD, top + 440),
                text="Continue",
                resource_id=f"{self.package}:id/next",
                clickable=True,
            ),
        ]


class _InvisiblePhone(VirtualPhone):
    """A phone whose `uiautomator dump` marks each node's visibility, as some versions do, and
    whose `…:id/hidden` view is laid out but not visible to the user."""

    def dump_hierarchy(self) -> str:
        return self._mark(super().dump_hierarchy())

    def dump_windows(self) -> str:
        return self._mark(super().dump_windows())

    @staticmethod
    def _mark(dump: str) -> str:
        dump = re.sub(r'(<node [^>]*?) bounds="', r'\1 visible-to-user="true" bounds="', dump)
        return re.sub(
            r'(resource-id="[^"]*:id/hidden"[^>]*?) visible-to-user="true"',
            r'\1 visible-to-user="false"',
            dump,
        )


async def test_the_node_host_shows_the_model_the_elements_the_python_host_does(
    node: str, tmp_path: Path
) -> None:
    """The Node host kept a node by a simpler rule than the Python host (host/perception/
    hierarchy.py `_is_kept`): it took only an `EditText` for a text field, so an empty
    AutoCompleteTextView (a search box, an address field) never reached the model, which could
    not type into it; and it kept a node the dump says is not visible to the user, which the
    model then tapped through to whatever lies on top. It now keeps what the Python host keeps
    of the same dump."""
    phone = _InvisiblePhone("emulator-5554")
    package = "com.example.form"
    phone.apps[package] = _FormApp(package, "Form", package + ".MainActivity", (30, 142, 62))
    assert phone.launch(package)
    seen, expected = await _first_look(
        node, tmp_path, phone, lambda e: (e.text, e.resource_id, e.class_name)
    )
    assert seen == expected
    assert f"{package}:id/city" in {rid for _, rid, _ in seen}
    assert f"{package}:id/hidden" not in {rid for _, rid, _ in seen}


class _EmptyFieldApp(StubApp):
    """A form whose empty field reports its hint as its text, as Android 8 and later do."""

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del phone, page
        top = geo.top + TOOLBAR_H
        return [
            Node(
                "android.widget.EditText",
                (PAD, top + 40, geo.width - PAD, top + 160),
                text="Name",
                hint="Name",
                resource_id=f"{self.package}:id/name",
                clickable=True,
            ),
            Node(
                "android.widget.Button",
                (PAD, top + 320, geo.width - PAD, top + 440),
                text="Continue",
                resource_id=f"{self.package}:id/next",
                clickable=True,
            ),
        ]


async def test_the_node_host_sends_an_empty_fields_hint_as_its_hint_not_its_text(
    node: str, tmp_path: Path
) -> None:
    """An empty field's dump gives its hint as its text (Android 8+). The Node host sent that as
    the field's text and no hint, so the model read "Name" as already typed in, where the
    contract (UiElement.hint) and the Python host send the hint and an empty text."""
    phone = VirtualPhone("emulator-5554")
    package = "com.example.empty"
    phone.apps[package] = _EmptyFieldApp(package, "Form", package + ".MainActivity", (30, 142, 62))
    assert phone.launch(package)
    seen, expected = await _first_look(
        node, tmp_path, phone, lambda e: (e.resource_id, e.text, e.hint)
    )
    assert seen == expected
    assert (f"{package}:id/name", "", "Name") in seen


async def test_the_node_host_says_the_screen_size_the_dump_is_in(node: str, tmp_path: Path) -> None:
    """`wm size` gives the natural size in every rotation, with a resolution setting's
    "Override size" after the "Physical size". The Node host took the first size it found and
    never turned it: a phone held sideways at a lowered resolution was reported as the
    portrait physical screen, so the model read every landscape bound against the wrong
    screen. It now reports what the Python host's driver reports: the override, turned."""
    phone = VirtualPhone("emulator-5554")
    phone.set_display_size((720, 1600))
    phone.rotate(1)
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    seen = decisions[0].observation
    assert (seen.screen_width, seen.screen_height) == (1600, 720)
    assert seen.rotation == types_pb2.ROTATION_90


_OFF_SCREEN = (
    '<node index="9" text="{text}" resource-id="com.android.launcher3:id/{rid}" '
    'class="android.widget.TextView" package="com.android.launcher3" content-desc="" '
    'checkable="false" checked="false" clickable="true" enabled="true" focusable="true" '
    'focused="false" scrollable="false" long-clickable="false" password="false" '
    'selected="false" bounds="{bounds}" drawing-order="9" hint="" />'
)


class _PagerPhone(VirtualPhone):
    """A phone whose dump lists views laid out off the screen, as real dumps do (a pager's
    next page wholly to the right, a row half past the edge)."""

    def dump_hierarchy(self) -> str:
        return self._pages(super().dump_hierarchy())

    def dump_windows(self) -> str:
        return self._pages(super().dump_windows())

    @staticmethod
    def _pages(dump: str) -> str:
        """The off-screen views at the end of the last window's tree (the app's, in both
        dumps: `--windows` lists the topmost first)."""
        extra = _OFF_SCREEN.format(
            text="Next page", rid="next_page", bounds="[1200,300][2300,400]"
        ) + _OFF_SCREEN.format(text="Half out", rid="half_out", bounds="[900,500][1500,600]")
        cut = dump.rindex("</node></hierarchy>")
        return dump[:cut] + extra + dump[cut:]


async def test_the_node_host_cuts_bounds_to_the_screen_as_the_python_host_does(
    node: str, tmp_path: Path
) -> None:
    """The Node host sent bounds as the dump gave them: a view laid out off the screen reached
    the model (a tap at its centre lands nowhere) and one half past the edge had its centre off
    the screen. It now keeps what the Python host keeps of the same dump, with the same bounds:
    cut to the screen, and left out when nothing is left of it."""
    phone = _PagerPhone("emulator-5554")
    seen, expected = await _first_look(
        node,
        tmp_path,
        phone,
        lambda e: (e.resource_id, (e.bounds.left, e.bounds.top, e.bounds.right, e.bounds.bottom)),
    )
    assert seen == expected
    ids = dict(seen)
    assert "com.android.launcher3:id/next_page" not in ids
    assert ids["com.android.launcher3:id/half_out"] == (900, 500, 1080, 600)


async def test_the_node_host_ends_a_step_refused_for_the_clouds_key_retryable(
    node: str, tmp_path: Path
) -> None:
    """The model provider refuses the cloud's API key (HTTP 401 from the fake provider, through
    the cloud's real Anthropic SDK): Decide answers PERMISSION_DENIED. Nothing the task did, so
    the Python host ends the attempt retryable and the task waits, held, for a key that works;
    host.js ended it plain FAILED, and the task failed for good for the cloud's key."""
    with FakeModelServer(anthropic_key="sk-ant-the-key-it-takes") as provider:
        planner = {
            "AMC_PLANNER_PROVIDER": "anthropic",
            "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
            "AMC_PLANNER_ANTHROPIC_API_KEY": "sk-ant-a-revoked-key",
            "AMC_PLANNER_ANTHROPIC_BASE_URL": provider.anthropic_base_url,
            "AMC_PLANNER_MAX_RETRIES": "0",
        }
        async with cloud_and_phone(
            tmp_path, VirtualPhone("emulator-5554"), HOST_ID, planner
        ) as rig:
            task_id = await dark_theme_task(rig.client, max_attempts=2)
            said = await _run_node(node, rig)
            ended = await wait_task(
                rig.client, task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
            )
    assert "rejected the API key" in said
    assert ended.status == types_pb2.TASK_STATUS_QUEUED, ended
    assert "rejected the API key" in ended.attempts[0].failure_reason


async def test_the_node_host_gives_phones_sharing_a_serial_their_own_ids_and_drives_each(
    node: str, tmp_path: Path
) -> None:
    """Two phones with the serial cheap phones ship with: adb lists both and refuses the serial
    as ambiguous ("more than one device"). host.js said hello with the serial twice and drove
    it with `host:transport:<serial>`, so every command failed; as the Python host does, each
    now has its own id (`serial@t<transport id>`) and is reached by its transport id."""
    serial = "0123456789ABCDEF"
    first, second = VirtualPhone(serial), VirtualPhone(serial)
    async with cloud_and_phone(tmp_path, first, HOST_ID, more=[second]) as rig:
        ids = [f"{serial}@t{rig.adb.transport_id(p)}" for p in (first, second)]
        task_id = await dark_theme_task(
            rig.client, max_attempts=1, target=types_pb2.TaskTarget(device_serial=ids[1])
        )
        said = await _run_node(node, rig)
        final = await wait_task(
            rig.client, task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
        )
        hosts = (await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
    assert sorted(d.serial for h in hosts for d in h.devices) == sorted(ids), said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert [first.state.flag("dark_theme"), second.state.flag("dark_theme")] == [False, True]


async def test_the_node_host_types_a_long_text_whole_on_a_phone_with_small_adb_packets(
    node: str, tmp_path: Path
) -> None:
    """adbd before Android 7 opens no request longer than its 4096-byte packet. host.js sent
    the whole text in one `input text` request, which the adb server could not open: the
    connection dropped and nothing was typed. As the Python host does, it now types the text in
    commands that each fit one request (quoted, this text of apostrophes takes almost 5000
    bytes)."""
    phone = VirtualPhone("emulator-5554")
    phone.adbd_max_payload = 4096
    body = "a'' " * 450 + "z"
    said, _, _ = await _one_task(
        node, tmp_path, phone, f'Create a note titled "Long" that says "{body}"'
    )
    assert [(n.title, n.body) for n in phone.state.notes] == [("Long", body)], said[-2000:]


async def test_the_node_host_types_a_literal_percent_s_as_written(
    node: str, tmp_path: Path
) -> None:
    """Android's `input text` turns every `%s` of its argument into a space and has no escape
    for a literal one: host.js sent the text as it was, so "50%sale" was typed "50 ale". As
    the Python host does (host/devices/adb_driver.py, `input_text_commands`), the text is now
    split between a literal `%` and the `s` after it, each piece typed by its own command."""
    phone = VirtualPhone("emulator-5554")
    body = "50%sale, 100%s sure %%s or %s%s end %"
    said, _, _ = await _one_task(
        node, tmp_path, phone, f'Create a note titled "Deals" that says "{body}"'
    )
    assert [(n.title, n.body) for n in phone.state.notes] == [("Deals", body)], said[-2000:]


async def test_the_node_host_sees_what_the_keyboard_covers_and_saves_the_note(
    node: str, tmp_path: Path
) -> None:
    """With the keyboard up, a note's Save button lies under it. host.js dumped the focused
    window alone (`uiautomator dump`), which knows nothing of the keyboard: Save reached the
    model at its full bounds, and each tap at its centre landed on the keyboard's space bar,
    typing a space into the note, until the step limit. The virtual phone is right (a tap
    there is the keyboard's on a phone too). As the Python host does, host.js now reads every
    window (`uiautomator dump --windows`): what the keyboard covers is cut to what is left in
    view (or left out), and the keyboard is one element the model can see."""
    phone = VirtualPhone("emulator-5554")
    said, final, decisions = await _one_task(
        node, tmp_path, phone, 'Create a note titled "Groceries" that says "milk and eggs"'
    )

    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said[-3000:]
    assert [(n.title, n.body) for n in phone.state.notes] == [("Groceries", "milk and eggs")]
    typed = [d for d in decisions if d.observation.keyboard_shown]
    assert typed, said[-3000:]
    assert all(
        "On-screen keyboard" in {e.content_description for e in d.observation.elements}
        for d in typed
    )


async def test_the_node_host_shows_the_model_what_the_python_host_does_with_the_keyboard_up(
    node: str, tmp_path: Path
) -> None:
    """The same screen (a new note, the keyboard up over its Save and Discard buttons) as each
    host shows it: host.js listed Save and Discard, under the keyboard, and not the keyboard;
    it now shows what the Python host's scene of the `--windows` dump shows."""
    phone = VirtualPhone("emulator-5554")
    assert phone.launch(NOTES)
    phone.tap(926, 2114)  # New note
    phone.tap(540, 784)  # the note's body: the keyboard comes up
    assert phone.keyboard_shown()

    def shown(e: Element | types_pb2.UiElement) -> tuple[str, str, str, tuple[int, ...]]:
        b = e.bounds
        desc = e.content_desc if isinstance(e, Element) else e.content_description
        return (e.text, desc, e.resource_id, (b.left, b.top, b.right, b.bottom))

    expected = [shown(e) for e in parse_scene(phone.dump_windows(), package=NOTES).elements]
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    assert [shown(e) for e in decisions[0].observation.elements] == expected
    assert "Save" not in {e.text for e in decisions[0].observation.elements}


async def test_the_node_host_reports_an_input_the_phone_refused_as_not_executed(
    node: str, tmp_path: Path
) -> None:
    """`input` says it failed only in what it prints (a SecurityException on a phone that
    refuses injected input, as Xiaomi's do until a developer setting allows it). host.js never
    read it: every refused tap was reported executed ("tapped (x, y)"), so the model and the
    cloud's check took the step as done. As the Python host does, the step is now reported not
    executed, with Android's words and the setting that allows it."""
    phone = VirtualPhone("emulator-5554")
    phone.refuse_injected_input = True
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    first = decisions[0]
    assert first.tool_name == "tap", said
    assert not first.outcome.executed, first.outcome
    assert "java.lang.SecurityException" in first.outcome.error
    assert "USB debugging (Security settings)" in first.outcome.error
    assert not phone.state.flag("dark_theme")
    assert final.status == types_pb2.TASK_STATUS_FAILED


async def test_the_node_host_reports_text_adb_cannot_type_as_not_typed(
    node: str, tmp_path: Path
) -> None:
    """`input text` has keys for ASCII only: given "Café" it throws and types nothing, and
    host.js reported "typed 4 characters". As the Python host does, such a text is refused up
    front and the step reported not executed, saying why (the text itself kept out of it)."""
    phone = VirtualPhone("emulator-5554")
    said, _final, decisions = await _one_task(
        node, tmp_path, phone, 'Create a note titled "Café" that says "crème brûlée"'
    )

    typing = [d for d in decisions if d.tool_name == "input_text"]
    assert typing, said
    assert not typing[0].outcome.executed, typing[0].outcome
    assert "can type ASCII only" in typing[0].outcome.error
    assert "Caf" not in typing[0].outcome.error
    assert not phone.state.notes


async def test_the_node_host_reports_an_app_that_did_not_launch_as_not_executed(
    node: str, tmp_path: Path
) -> None:
    """For an app that is not installed monkey prints "** No activities found to run, monkey
    aborted." and exits 0 on most builds: host.js reported the launch executed, with monkey's
    words as its output. As the Python host does (`check_launched`), it is now not executed,
    saying the app could not be launched; a name that is no package name is refused before
    it reaches the shell."""
    steps = [
        anthropic_message(
            tool_use(
                "launch_app",
                {"package_name": package, "purpose": "open", "expected_outcome": "open"},
            )
        )
        for package in ("com.example.missing", "com.example;reboot")
    ]
    done = anthropic_message(tool_use("complete", {"success": False, "reason": "no such app"}))
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as provider:
        provider.script_anthropic(*steps, done)
        planner = {
            "AMC_PLANNER_PROVIDER": "anthropic",
            "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
            "AMC_PLANNER_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            "AMC_PLANNER_ANTHROPIC_BASE_URL": provider.anthropic_base_url,
            "AMC_PLANNER_MAX_RETRIES": "0",
        }
        async with cloud_and_phone(
            tmp_path, VirtualPhone("emulator-5554"), HOST_ID, planner
        ) as rig:
            task = (
                await rig.client.tasks.SubmitTask(
                    task_service_pb2.SubmitTaskRequest(goal="Open the missing app", max_attempts=1),
                    timeout=10,
                )
            ).task
            said = await _run_node(node, rig)
            decisions = (
                await rig.client.decisions.ListDecisions(
                    decision_log_service_pb2.ListDecisionsRequest(task_id=task.task_id),
                    timeout=10,
                )
            ).decisions
    missing, bad = decisions[0].outcome, decisions[1].outcome
    assert not missing.executed, (missing, said)
    assert "cannot launch com.example.missing" in missing.error
    assert not bad.executed, (bad, said)
    assert "not a package name: 'com.example;reboot'" in bad.error
