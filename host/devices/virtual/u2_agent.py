"""The uiautomator2 on-device agent, emulated: so the real `uiautomator2` library drives the phone.

uiautomator2 pushes `u2.jar`, starts it with `CLASSPATH=… app_process / com.wetest.uia2.Main -p
PORT` over a held-open `adb shell`, then speaks HTTP JSON-RPC 2.0 to it through `tcp:PORT`. Here
`app_process` registers an agent on the phone for as long as that shell stays open, and the agent
answers the JSON-RPC methods the library's Device API uses.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import time
from collections.abc import Callable
from typing import Any

from host.devices.virtual.android_tools import BRIDGE_TAKEN
from host.devices.virtual.commands import Output, Registry, Session
from host.devices.virtual.layout import Node
from host.devices.virtual.phone import (
    AUTOMATION_LOST_TRACE,
    DUMP_NPE_TRACE,
    OUT_OF_MEMORY_TRACE,
    BridgeTaken,
    DumpCrashed,
    DumpKilled,
    IdleStateError,
    NullRootError,
    VirtualPhone,
)

registry = Registry()

MAIN_CLASS = "com.wetest.uia2.Main"
DEFAULT_PORT = 9008
KEY_NAMES = {
    "home": "HOME",
    "back": "BACK",
    "left": "DPAD_LEFT",
    "right": "DPAD_RIGHT",
    "up": "DPAD_UP",
    "down": "DPAD_DOWN",
    "center": "DPAD_CENTER",
    "menu": "MENU",
    "search": "SEARCH",
    "enter": "ENTER",
    "delete": "DEL",
    "del": "DEL",
    "recent": "APP_SWITCH",
    "volume_up": "VOLUME_UP",
    "volume_down": "VOLUME_DOWN",
    "volume_mute": "VOLUME_MUTE",
    "camera": "CAMERA",
    "power": "POWER",
}
NOT_FOUND = -32002
MAX_BODY = 16 * 1024 * 1024
_STARTING = "[server] INFO: [UiAutomator2Server] Starting Server\n"
_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error", 502: "Bad Gateway"}


#: The frames below the failing method in every trace the real agent sends, as in the
#: SecurityException of openatx/uiautomator2#1029 and #1082 (`AutomatorServiceImpl` is called
#: through jsonrpc4j from NanoHTTPD's client thread).
_SERVER_FRAMES = (
    "\tat java.lang.reflect.Method.invoke(Native Method)\n"
    "\tat com.googlecode.jsonrpc4j.JsonRpcBasicServer.invoke(JsonRpcBasicServer.java:467)\n"
    "\tat com.googlecode.jsonrpc4j.JsonRpcBasicServer.handleObject(JsonRpcBasicServer.java:352)\n"
    "\tat com.googlecode.jsonrpc4j.JsonRpcBasicServer.handleJsonNodeRequest"
    "(JsonRpcBasicServer.java:283)\n"
    "\tat com.googlecode.jsonrpc4j.JsonRpcBasicServer.handleRequest(JsonRpcBasicServer.java:251)\n"
    "\tat com.wetest.uia2.stub.AutomatorHttpServer.serve(AutomatorHttpServer.java:101)\n"
    "\tat fi.iki.elonen.NanoHTTPD.serve(NanoHTTPD.java:2244)\n"
    "\tat fi.iki.elonen.NanoHTTPD$HTTPSession.execute(NanoHTTPD.java:945)\n"
    "\tat fi.iki.elonen.NanoHTTPD$ClientHandler.run(NanoHTTPD.java:192)\n"
    "\tat java.lang.Thread.run(Thread.java:1012)\n"
)


def java_error(method: str, exception: str, message: str) -> dict[str, Any]:
    """The JSON-RPC error the real agent answers when `method` throws: its jsonrpc4j error
    resolver (android-uiautomator-server's Stub.java) sends code -32001, the exception's class
    as the message and `printStackTrace`'s text as the data."""
    trace = (
        f"{exception}: {message}\n"
        f"\tat com.wetest.uia2.stub.AutomatorServiceImpl.{method}(AutomatorServiceImpl.java:1652)\n"
        + _SERVER_FRAMES
    )
    return {"code": -32001, "message": exception, "data": trace}


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: The Java stack trace the real agent sends as the error's `data`.
        self.data = data


@registry.tool("app_process")
def _app_process(sh: Session, args: list[str], stdin: bytes) -> Output:
    """Start the agent if the command line is uiautomator2's; it runs until the shell closes."""
    classpath = sh.env.get("CLASSPATH", "")
    if MAIN_CLASS not in args:
        return Output().err("Error: no main class the virtual phone can run\n", 1)
    if not classpath or sh.phone.files.read(classpath) is None:
        return Output().err(f'Exception in thread "main" ClassNotFoundException: {MAIN_CLASS}\n', 1)
    port = DEFAULT_PORT
    if "-p" in args[:-1]:
        port = int(args[args.index("-p") + 1])
    phone = sh.phone
    if port in phone.tcp_services:
        return Output().err(f"java.net.BindException: Address already in use (port {port})\n", 1)
    if phone.dumper is not None:
        # A running `uiautomator dump` holds the accessibility bridge (see `hang_dumps`).
        return Output().out(_STARTING).err(BRIDGE_TAKEN, 1)
    if phone.u2_launch_crash:
        return Output().out(_STARTING).err(phone.u2_launch_crash, 1)

    def crash() -> None:
        if phone.tcp_services.get(port) is agent:
            del phone.tcp_services[port]
        sh.cancel.set()

    agent = U2Agent(phone, crash)
    phone.tcp_services[port] = agent
    process = phone.processes.spawn("app_process", "shell", sh.cancel)
    try:
        sh.wait(float("inf"))
    finally:
        phone.processes.exited(process)
        if phone.tcp_services.get(port) is agent:
            del phone.tcp_services[port]
    return Output().out(_STARTING)


class U2Agent:
    """One running agent: an HTTP server (one request per connection) for JSON-RPC calls."""

    def __init__(self, phone: VirtualPhone, crash: Callable[[], None] = lambda: None) -> None:
        self.phone = phone
        #: The phone's `u2_automation_epoch` when this agent started: once the phone's moves
        #: on, this agent's UiAutomation is gone (`VirtualPhone.lose_u2_automation`).
        self._epoch = phone.u2_automation_epoch
        #: The same for its heap (`VirtualPhone.exhaust_u2_memory`).
        self._memory_epoch = phone.u2_memory_epoch
        #: Ends this agent's process at once (`VirtualPhone.crash_u2_agent`).
        self._crash = crash
        self._touch_down: tuple[int, int] | None = None
        self._packages: dict[int, str] = {}
        self._methods: dict[str, Callable[..., Any]] = {
            "deviceInfo": self.device_info,
            "dumpWindowHierarchy": self.dump,
            "takeScreenshot": self.screenshot,
            "click": self.click,
            "swipe": self.swipe,
            "swipePoints": self.swipe_points,
            "drag": self.drag,
            "pressKey": self.press_key,
            "pressKeyCode": self.press_key_code,
            "injectInputEvent": self.inject,
            "setClipboard": self.set_clipboard,
            "getClipboard": lambda: self.phone.clipboard,
            "pasteClipboard": self.paste,
            "clearInputText": self.clear_input,
            "wakeUp": self.wake_up,
            "sleep": self.sleep,
            "freezeRotation": lambda *a: True,
            "setOrientation": lambda *a: True,
            "getLastToast": self.last_toast,
            "clearLastToast": self.clear_toast,
            "makeToast": self.make_toast,
            "openNotification": lambda: self._shade(False),
            "openQuickSettings": lambda: self._shade(True),
            "getLastTraversedText": lambda: self.phone.traversed_text,
            "clearLastTraversedText": self.clear_traversed_text,
            "exist": lambda sel: self._find(sel) is not None,
            "waitForExists": lambda sel, timeout=0: self._find(sel) is not None,
            "waitUntilGone": lambda sel, timeout=0: self._find(sel) is None,
            "count": lambda sel: len(self._all(sel)),
            "objInfo": lambda sel: self._info(self._must(sel)),
            "objInfoOfAllInstances": lambda sel: [self._info(n) for n in self._all(sel)],
            "getText": lambda sel: self._must(sel).text,
            "setText": self.set_text,
            "clearTextField": lambda sel: self.set_text(sel, ""),
        }

    # --- HTTP --------------------------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = [*lines[0].split(" "), "", ""][:3]
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
        }
        length = int(headers.get("content-length", "0") or 0)
        body = await reader.readexactly(min(length, MAX_BODY)) if length else b""
        if method == "GET" and path == "/ping":
            self.phone.u2_pings += 1
            status, payload, ctype = 200, b"pong", "text/plain"
        elif method == "POST" and path.startswith("/jsonrpc/0"):
            crash = self.phone.take_u2_crash()
            if crash == "unanswered":
                self._crash()
                return  # the connection closes with no answer
            garbled = self.phone.take_u2_garble()
            if garbled is not None:
                writer.write(garbled)
                await writer.drain()
                return  # the connection closes after what is no HTTP answer
            hang = self.phone.take_u2_hang()
            if hang is not None:
                await asyncio.sleep(hang)
            failure = self.phone.u2_http_failure(self)
            if failure is not None:
                status, payload, ctype = failure, b"Internal Error", "text/plain"
            else:
                answer = await asyncio.to_thread(self.handle_jsonrpc, body)
                status, payload, ctype = 200, json.dumps(answer).encode(), "application/json"
            if crash == "mid_answer":
                writer.write(
                    f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload[: len(payload) // 2]
                )
                await writer.drain()
                self._crash()
                return
        else:
            status, payload, ctype = 404, b"not found", "text/plain"
        reason = _REASONS.get(status, "Error")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()

    def handle_jsonrpc(self, body: bytes) -> dict[str, Any]:
        try:
            request = json.loads(body)
        except ValueError:
            return {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": "Parse error"},
            }
        rid = request.get("id")
        method = self._methods.get(str(request.get("method")))
        if method is None:
            error = {"code": -32601, "message": f"Method not found: {request.get('method')}"}
            return {"jsonrpc": "2.0", "id": rid, "error": error}
        params = request.get("params") or []
        if self.phone.u2_automation_epoch != self._epoch:
            lost = {
                "code": -32001,
                "message": "java.lang.IllegalStateException",
                "data": AUTOMATION_LOST_TRACE,
            }
            return {"jsonrpc": "2.0", "id": rid, "error": lost}
        if self.phone.u2_memory_epoch != self._memory_epoch:
            oom = {
                "code": -32001,
                "message": "java.lang.OutOfMemoryError",
                "data": OUT_OF_MEMORY_TRACE,
            }
            return {"jsonrpc": "2.0", "id": rid, "error": oom}
        failure = self.phone.u2_call_failures.get(str(request.get("method")))
        if failure is not None:
            return {"jsonrpc": "2.0", "id": rid, "error": java_error(request["method"], *failure)}
        try:
            result = method(**params) if isinstance(params, dict) else method(*params)
        except RpcError as exc:
            failed: dict[str, Any] = {"code": exc.code, "message": exc.message}
            if exc.data is not None:
                failed["data"] = exc.data
            return {"jsonrpc": "2.0", "id": rid, "error": failed}
        except (TypeError, ValueError) as exc:
            return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": str(exc)}}
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    # --- device methods ----------------------------------------------------------------------

    def device_info(self) -> dict[str, Any]:
        p = self.phone
        return {
            "currentPackageName": p.current_package(),
            "displayWidth": p.width,
            "displayHeight": p.height,
            "displayRotation": p.rotation,
            "displaySizeDpX": round(p.width * 160 / 420),
            "displaySizeDpY": round(p.height * 160 / 420),
            "naturalOrientation": True,
            "productName": "amc_virtual",
            "screenOn": p.awake,
            "sdkInt": p.sdk,
        }

    def dump(self, compressed: bool = False, max_depth: int = 50, *rest: Any) -> str | None:
        """Every window's root (androidx `dumpWindowHierarchy`), or the active window's alone
        when the third argument (`root_in_active`) asks for it."""
        del compressed
        if self.phone.take_u2_dump_null():
            return None
        try:
            if rest and rest[0]:
                return self.phone.dump_hierarchy()
            xml = self.phone.dump_window_roots(int(max_depth))
        except (IdleStateError, NullRootError, DumpKilled, BridgeTaken):
            return ""  # what the real agent answers when it cannot get a settled screen
        except DumpCrashed as exc:
            # jsonrpc4j's answer to an exception thrown in the method: -32001 with the trace.
            raise RpcError(-32001, "java.lang.NullPointerException", DUMP_NPE_TRACE) from exc
        levels = self.phone.u2_stack_levels
        if levels is not None and _depth(xml) > levels:
            frame = "\tat com.github.uiautomator.stub.AccessibilityNodeInfoDumper.dumpNodeRec\n"
            trace = "java.lang.StackOverflowError: stack size 1043KB\n" + frame * 40
            raise RpcError(-32001, "java.lang.StackOverflowError", trace)
        return xml

    def wake_up(self) -> bool:
        self.phone.wake()
        return True

    def sleep(self) -> bool:
        self.phone.sleep()
        return True

    def _shade(self, quick_settings: bool) -> bool:
        self.phone.open_shade(quick_settings)
        return True

    def last_toast(self, *args: Any) -> str | None:
        del args
        return self.phone.last_toast

    def clear_toast(self) -> bool:
        self.phone.last_toast = None
        return True

    def make_toast(self, text: str = "", duration: float = 1.0) -> bool:
        self.phone.show_toast(str(text), float(duration))
        return True

    def clear_traversed_text(self) -> bool:
        self.phone.traversed_text = None
        return True

    def screenshot(self, scale: float = 1.0, quality: int = 80) -> str | None:
        if self.phone.u2_screenshot_null:
            return None
        if self.phone.u2_screenshot_text is not None:
            return self.phone.u2_screenshot_text
        if self.phone.u2_screenshot_error:
            error = self.phone.u2_screenshot_error
            trace = (
                f"{error}: Failed resolution of: Ljava/util/Base64;\n"
                "\tat com.github.uiautomator.stub.AutomatorServiceImpl.takeScreenshot"
                "(AutomatorServiceImpl.java:402)\n"
            )
            raise RpcError(-32001, error, trace)
        garbled = self.phone.take_garbled_shot(png=False)
        if garbled is not None:
            return base64.b64encode(garbled).decode()
        img = self.phone.screenshot()
        if scale != 1.0:
            img = img.resize((max(1, int(img.width * scale)), max(1, int(img.height * scale))))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=int(quality))
        return base64.b64encode(buf.getvalue()).decode()

    def click(self, x: Any, y: Any = None, duration_ms: int = 0) -> bool:
        if isinstance(x, dict):  # click(selector): the object's centre
            x, y = _center(self._must(x))
        if duration_ms >= 500:
            self.phone.long_press(int(x), int(y))
        else:
            self.phone.tap(int(x), int(y))
        return True

    def swipe(self, fx: int, fy: int, tx: int, ty: int, steps: int = 10) -> bool:
        """UiDevice.swipe: `steps` moves of 5 ms each, so the call takes that long."""
        duration_ms = int(steps) * 5
        time.sleep(duration_ms / 1000)
        self.phone.swipe(int(fx), int(fy), int(tx), int(ty), duration_ms)
        return True

    def swipe_points(self, points: list[int], steps: int = 10) -> bool:
        if len(points) >= 4:
            self.swipe(points[0], points[1], points[-2], points[-1], steps)
        return True

    def drag(self, sx: int, sy: int, ex: int, ey: int, steps: int = 100) -> bool:
        return self.swipe(sx, sy, ex, ey, steps)

    def press_key(self, key: str) -> bool:
        name = KEY_NAMES.get(key.lower(), key)
        return self.phone.press_key(name)

    def press_key_code(self, code: int, meta: int = 0) -> bool:
        del meta
        return self.phone.press_key(int(code))

    def inject(self, action: int, x: float, y: float, meta: int = 0) -> bool:
        """Raw touch events: DOWN remembers the point, UP taps or swipes from it."""
        del meta
        point = (int(x), int(y))
        if action == 0:
            self._touch_down = point
        elif action == 1:
            start = self._touch_down or point
            self._touch_down = None
            self.phone.swipe(*start, *point, 100)
        return True

    def paste(self) -> bool:
        self.phone.input_text(self.phone.clipboard)
        return True

    def clear_input(self) -> bool:
        self.phone.clear_text()
        return True

    def set_clipboard(self, label: str | None, text: str) -> None:
        del label
        self.phone.clipboard = text

    def set_text(self, selector: dict[str, Any], text: str) -> bool:
        node = self._must(selector)
        if node.on_set_text is None:
            return False
        node.on_set_text(text)
        return True

    # --- UiSelector matching -----------------------------------------------------------------

    def _all(self, selector: dict[str, Any]) -> list[Node]:
        """Matching nodes in every window, topmost window first (UiDevice searches them all)."""
        found: list[Node] = []
        for surface in reversed(self.phone.surfaces()):

            def visit(node: Node, index: int, package: str = surface.package) -> None:
                if _matches(node, index, package, selector):
                    found.append(node)
                    self._packages[id(node)] = package
                for i, child in enumerate(node.children):
                    visit(child, i)

            visit(surface.root, 0)
        if "instance" in selector:
            n = int(selector["instance"])
            return found[n : n + 1]
        return found

    def _find(self, selector: dict[str, Any]) -> Node | None:
        nodes = self._all(selector)
        return nodes[0] if nodes else None

    def _must(self, selector: dict[str, Any]) -> Node:
        node = self._find(selector)
        if node is None:
            shown = {k: v for k, v in selector.items() if k not in _SELECTOR_META}
            raise RpcError(
                NOT_FOUND, f"androidx.test.uiautomator.UiObjectNotFoundException: {shown}"
            )
        return node

    def _info(self, node: Node) -> dict[str, Any]:
        x1, y1, x2, y2 = node.bounds
        box = {"left": x1, "top": y1, "right": x2, "bottom": y2}
        return {
            "bounds": box,
            "visibleBounds": box,
            "childCount": len(node.children),
            "className": node.cls,
            "contentDescription": node.content_desc or None,
            "packageName": self._packages.get(id(node), self.phone.current_package()),
            "resourceName": node.resource_id or None,
            "text": node.text,
            "checkable": node.checkable,
            "checked": node.checked,
            "clickable": node.clickable,
            "enabled": node.enabled,
            "focusable": node.focusable,
            "focused": node.focused,
            "longClickable": node.long_clickable,
            "scrollable": node.scrollable,
            "selected": node.selected,
        }


_SELECTOR_META = {"mask", "childOrSibling", "childOrSiblingSelector"}


def _center(node: Node) -> tuple[int, int]:
    x1, y1, x2, y2 = node.bounds
    return (x1 + x2) // 2, (y1 + y2) // 2


def _matches(node: Node, index: int, package: str, sel: dict[str, Any]) -> bool:
    """UiSelector semantics for the fields uiautomator2 sends (instance is applied later)."""
    checks: dict[str, Callable[[Any], bool]] = {
        "text": lambda v: node.text == v,
        "textContains": lambda v: v in node.text,
        "textMatches": lambda v: re.fullmatch(v, node.text) is not None,
        "textStartsWith": lambda v: node.text.startswith(v),
        "className": lambda v: node.cls == v,
        "classNameMatches": lambda v: re.fullmatch(v, node.cls) is not None,
        "description": lambda v: node.content_desc == v,
        "descriptionContains": lambda v: v in node.content_desc,
        "descriptionMatches": lambda v: re.fullmatch(v, node.content_desc) is not None,
        "descriptionStartsWith": lambda v: node.content_desc.startswith(v),
        "checkable": lambda v: node.checkable == v,
        "checked": lambda v: node.checked == v,
        "clickable": lambda v: node.clickable == v,
        "longClickable": lambda v: node.long_clickable == v,
        "scrollable": lambda v: node.scrollable == v,
        "enabled": lambda v: node.enabled == v,
        "focusable": lambda v: node.focusable == v,
        "focused": lambda v: node.focused == v,
        "selected": lambda v: node.selected == v,
        "packageName": lambda v: package == v,
        "packageNameMatches": lambda v: re.fullmatch(v, package) is not None,
        "resourceId": lambda v: node.resource_id == v,
        "resourceIdMatches": lambda v: re.fullmatch(v, node.resource_id) is not None,
        "index": lambda v: index == v,
    }
    for key, value in sel.items():
        if key in _SELECTOR_META or key == "instance":
            continue
        check = checks.get(key)
        if check is None or not check(value):
            return False
    return True


def _depth(xml: str) -> int:
    """How many `<node>` levels deep `xml` goes (what the server's dumper recursed through)."""
    depth = deepest = 0
    for tag in re.finditer(r"<(/?)node\b[^>]*?(/?)>", xml):
        if tag.group(1):
            depth -= 1
        elif not tag.group(2):
            depth += 1
            deepest = max(deepest, depth)
        else:
            deepest = max(deepest, depth + 1)
    return deepest
