"""What the uiautomator2 driver types is told nowhere: not in a log line, not in an error.

The real uiautomator2 library drives the virtual phone's emulated on-device server over the
adb protocol. uiautomator2 puts each JSON-RPC call's params into its errors and its debug
lines, and those params are the typed text of `setText` and `setClipboard` (a password the
task types); its AdbKeyboard broadcast carries the text in base64 on a shell command line.
"""

from __future__ import annotations

import base64
import logging
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.progress import ProgressHolder
from host.devices.base import DeviceBusy, DeviceError, DeviceGone
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.perception.hierarchy import parse_scene
from host.perception.perceive import Perceiver
from host.timeline.store import TimelineStore
from planner.scene import Scene
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text

SERIAL = "emulator-5554"
#: A password a task types.
TYPED = "hunter2-Zoë-4711"
#: uiautomator2's own keyboard (the helper APK's AdbKeyboard IME).
HELPER_APK = "com.github.uiautomator"


@pytest.fixture
def served() -> Iterator[tuple[ThreadedAdbServer, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone])
    server.start()
    yield server, phone
    server.stop()


def _told(text: str) -> bool:
    """Whether `text` tells the typed password, as typed or as the AdbKeyboard's base64."""
    return TYPED in text or base64.b64encode(TYPED.encode()).decode() in text


def _focus_a_field(d: U2Driver) -> None:
    """Open the contacts editor and focus its first field."""
    d.launch_app("com.android.contacts")
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    create = next(e for e in scene.elements if "Create contact" in (e.text, e.content_desc))
    d.tap(*create.bounds.center)
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    d.tap(*next(e for e in scene.elements if "EditText" in e.class_name).bounds.center)


def by_class(cls: str, **extra: Any) -> Callable[[Scene], dict[str, Any]]:
    """Pick the first element of class `cls`."""

    def pick(scene: Scene) -> dict[str, Any]:
        return {
            "element_id": next(e for e in scene.elements if e.class_name == cls).element_id,
            **extra,
        }

    return pick


def _files(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _agent_pids(phone: VirtualPhone) -> list[int]:
    return [p.pid for p in phone.processes.spawned() if p.name == "app_process"]


@pytest.mark.parametrize("keyboard", ["clipboard", "adb_keyboard"])
def test_uiautomator2s_debug_lines_never_carry_the_typed_text(
    served: tuple[ThreadedAdbServer, VirtualPhone],
    caplog: pytest.LogCaptureFixture,
    keyboard: str,
) -> None:
    """uiautomator2 logs every JSON-RPC request with its params ("http request POST
    /jsonrpc/0 {… 'setClipboard', 'params': (None, '<text>')}") and every shell command
    ("shell: am broadcast -a ADB_KEYBOARD_INPUT_TEXT --es text <base64>") at DEBUG: a host
    run with AMC_LOG_LEVEL=DEBUG wrote every typed password to its log."""
    server, phone = served
    if keyboard == "adb_keyboard":
        phone.installed.add(HELPER_APK)
    d = U2Driver(SERIAL, port=server.port)
    _focus_a_field(d)
    caplog.set_level(logging.DEBUG)
    d.input_text(TYPED)
    page = phone.current_page()
    assert page.focus is not None and page.fields[page.focus] == TYPED
    assert not _told(caplog.text)
    assert logging.getLogger("uiautomator2.core").isEnabledFor(logging.WARNING)


@pytest.mark.filterwarnings("ignore:set FastInputIME failed")
def test_a_text_the_server_fails_to_type_is_told_nowhere_and_keeps_the_server(
    served: tuple[ThreadedAdbServer, VirtualPhone], caplog: pytest.LogCaptureFixture
) -> None:
    """The AdbKeyboard takes no broadcast (its service is not running), so uiautomator2 types
    with `setText(selector, text)`, which throws on the phone. uiautomator2 raises
    `RPCUnknownError(summary, params, java_trace)`, and the driver's message was its whole
    text: the typed password and the Java stack trace. And because the trace said "closed",
    the driver took the error for a dropped connection: it restarted the server and called
    the phone busy. The error's shape is the real server's (jsonrpc4j's -32001, the
    exception's class, `printStackTrace`'s text: `u2_agent.java_error`); its message is
    made up to hold the word."""
    server, phone = served
    phone.installed.add(HELPER_APK)
    d = U2Driver(SERIAL, port=server.port)
    _focus_a_field(d)
    first = _agent_pids(phone)
    phone.adb_keyboard_unbound = True
    thrown = "java.lang.IllegalStateException: the field's input connection is closed"
    phone.fail_u2_call("setText", *thrown.split(": ", 1))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DeviceError) as raised:
        d.input_text(TYPED)
    assert not isinstance(raised.value, DeviceBusy), raised.value  # the server answered
    assert thrown in str(raised.value)
    assert "AutomatorServiceImpl" not in str(raised.value)  # no stack trace
    told = "".join(traceback.format_exception(raised.value))  # what a logged traceback says
    assert not _told(str(raised.value)) and not _told(told)
    assert not _told(caplog.text)
    assert _agent_pids(phone) == first  # not restarted


@pytest.mark.filterwarnings("ignore:set FastInputIME failed")
async def test_an_attempt_whose_secret_the_server_fails_to_type_tells_it_nowhere(
    served: tuple[ThreadedAdbServer, VirtualPhone],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """The same failure in a task through the real agent loop: the step's progress line
    (live to the cloud, and in the timeline) said the driver's error unmasked, so it carried
    the secret the task typed; and two such steps in a row ended the attempt as a phone that
    did not answer. Now each is a failed step, and the attempt goes on to its end."""
    server, phone = served
    phone.installed.add(HELPER_APK)
    phone.adb_keyboard_unbound = True
    phone.fail_u2_call("setText", "java.lang.IllegalStateException", "connection closed")
    field = by_class("android.widget.EditText", text="{{secret:pin}}")
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.contacts"}),
            Step("tap", by_text("Create contact")),
            Step("input_text", field, "type the PIN", "the field holds the PIN"),
            Step("input_text", field, "type the PIN again", "the field holds the PIN"),
            Step("complete", {"success": False, "reason": "the PIN would not go in"}),
        ]
    )
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    progress = ProgressHolder()
    lines: list[str] = []
    progress.add_listener(lambda snap: lines.append(snap.summary))
    loop = AgentLoop(
        U2Driver(SERIAL, port=server.port),
        planner,
        Perceiver(None, retry_delay_s=0),
        store,
        LoopSettings(max_steps=8, settle_delay_s=0, ocr=False),
    )
    caplog.set_level(logging.DEBUG)
    try:
        outcome = await loop.run(
            TaskSpec("t1", 1, "Type the PIN {{secret:pin}}", SERIAL, secrets={"pin": TYPED}),
            progress,
        )
        steps = store.steps("t1", 1)
    finally:
        store.close()
    assert outcome.summary == "the PIN would not go in", outcome.summary
    failed = [s for s in steps if s.tool_name == "input_text"]
    assert len(failed) == 2 and not any(s.success for s in failed)
    assert all(
        "java.lang.IllegalStateException: connection closed" in (s.error or "") for s in failed
    )
    assert not _told(outcome.summary) and not any(_told(line) for line in lines)
    assert not _told(caplog.text)
    assert TYPED.encode() not in _files(tmp_path)  # timeline rows: steps, progress lines
    assert len(_agent_pids(phone)) == 1  # never restarted


def test_an_adb_keyboard_that_leaves_the_input_methods_as_it_is_selected_fails_the_step(
    served: tuple[ThreadedAdbServer, VirtualPhone], caplog: pytest.LogCaptureFixture
) -> None:
    """uiautomator2's `send_keys` selects its AdbKeyboard in `set_input_ime`, which lists the
    phone's input methods and then checks with a bare `assert` that a second list still names
    it (uiautomator2 3.7 `_input.py:59`: `assert self.__ime_id in self.__get_ime_list()`).
    Its helper app removed between the two lists (adbutils' `install(..., uninstall=True)`,
    which uiautomator2's `_setup_ime` runs, takes it off first) made that an `AssertionError`,
    which no driver error covered: the attempt ended failed for good as a host error. It is
    now the step's failure, saying what happened and not the text; typing again works
    (through the clipboard, the helper app gone). The removal is the virtual phone's
    (`helper_uninstalled_after_ime_lists`); uiautomator2 and adbutils are the real ones."""
    server, phone = served
    phone.installed.add(HELPER_APK)
    d = U2Driver(SERIAL, port=server.port)
    _focus_a_field(d)
    # uiautomator2's `send_keys` lists the input methods to choose the AdbKeyboard over the
    # clipboard, `set_input_ime` lists them again, then its `assert` a third time.
    phone.helper_uninstalled_after_ime_lists = 2
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DeviceError) as raised:
        d.input_text(TYPED)
    assert not isinstance(raised.value, DeviceBusy), raised.value  # the phone answered
    message = str(raised.value)
    assert f"input text failed on {SERIAL}" in message and "AdbKeyboard" in message, message
    told = "".join(traceback.format_exception(raised.value))
    assert not _told(message) and not _told(told) and not _told(caplog.text)
    d.input_text(TYPED)
    page = phone.current_page()
    assert page.focus is not None and page.fields[page.focus] == TYPED


@pytest.mark.parametrize("back", [False, True], ids=["unplugged", "replugged"])
def test_a_typing_broadcast_cut_short_tells_the_text_nowhere(
    served: tuple[ThreadedAdbServer, VirtualPhone],
    caplog: pytest.LogCaptureFixture,
    back: bool,
) -> None:
    """The cable is pulled while the AdbKeyboard's broadcast runs: the adb server ends the
    shell stream cleanly, and adbutils raises `AdbError("shell output invalid", command,
    output)` (adbutils 2.x `_shell_v1`), which uiautomator2 wraps in `AdbShellError`; the
    command is `am broadcast … --es text <the typed text in base64>`. The step's error
    carried it whole when the phone was back by the time adb was asked (a USB reconnect),
    and the traceback of the `DeviceGone` did when it was not. (The virtual phone's typing
    is wrapped only to time the unplug; uiautomator2 and adbutils are the real ones.)"""
    server, phone = served
    phone.installed.add(HELPER_APK)
    d = U2Driver(SERIAL, port=server.port)
    _focus_a_field(d)
    typed = phone.input_text

    def unplugged_while_typing(text: str) -> None:
        server.unplug(SERIAL)
        if back:
            server.replug(SERIAL)
        else:
            typed(text)

    phone.input_text = unplugged_while_typing  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DeviceError) as raised:
        d.input_text(TYPED)
    assert isinstance(raised.value, DeviceGone) is not back, raised.value
    told = "".join(traceback.format_exception(raised.value))
    assert "shell output invalid" in told  # the cut the test means
    assert not _told(str(raised.value)) and not _told(told) and not _told(caplog.text)


@pytest.mark.filterwarnings("ignore:set FastInputIME failed")
def test_a_java_exception_that_quotes_the_typed_text_keeps_only_its_class_and_a_masked_message(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A ROM's field that throws quoting what it was asked to type (the text is no task secret
    the attempt knows of, so nothing later masks it): the driver's error, which goes to the
    cloud as the step's outcome and progress line, carried the Java message whole. It keeps
    the exception's class, and its message bounded with the typed text masked. The error's
    shape is the real server's (`u2_agent.java_error`); the ROM's words are made up."""
    server, phone = served
    phone.installed.add(HELPER_APK)
    d = U2Driver(SERIAL, port=server.port)
    _focus_a_field(d)
    phone.adb_keyboard_unbound = True  # uiautomator2 types with setText
    said = f"input rejected by the ROM's filter: '{TYPED}' " + "x" * 5000
    phone.fail_u2_call("setText", "java.lang.IllegalArgumentException", said)
    with pytest.raises(DeviceError) as raised:
        d.input_text(TYPED)
    message = str(raised.value)
    assert "java.lang.IllegalArgumentException: input rejected by the ROM's filter: '•" in message
    assert not _told(message), message
    assert not _told("".join(traceback.format_exception(raised.value)))
    assert len(message) < 1000, message
