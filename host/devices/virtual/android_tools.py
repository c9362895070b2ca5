"""The Android commands drivers run over `adb shell`: input, am, monkey, wm, screencap,
uiautomator, getprop, pm, settings, svc, ime. Output follows the real tools closely enough for
the parsers in adbutils, uiautomator2 and our own drivers. (`dumpsys`, `cmd`, `logcat` and the
process tools live in `system_tools`.)"""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct
import threading
import time
import zipfile

from host.devices.virtual.commands import Output, Registry, Session
from host.devices.virtual.phone import (
    BridgeTaken,
    DumpCrashed,
    DumpKilled,
    IdleStateError,
    NoWindowsError,
    NullRootError,
)

registry = Registry()

ACTION_PAGES = {
    "android.settings.SETTINGS": ("com.android.settings", "com.android.settings.Settings"),
    "android.settings.WIFI_SETTINGS": (
        "com.android.settings",
        "com.android.settings.Settings$WifiSettingsActivity",
    ),
    "android.settings.DISPLAY_SETTINGS": (
        "com.android.settings",
        "com.android.settings.Settings$DisplaySettingsActivity",
    ),
    "android.settings.SOUND_SETTINGS": (
        "com.android.settings",
        "com.android.settings.Settings$SoundSettingsActivity",
    ),
    "android.settings.BATTERY_SAVER_SETTINGS": (
        "com.android.settings",
        "com.android.settings.Settings$PowerUsageSummaryActivity",
    ),
    "android.settings.DEVICE_INFO_SETTINGS": (
        "com.android.settings",
        "com.android.settings.Settings$MyDeviceInfoActivity",
    ),
}
EXTRA_PACKAGES = [
    "android",
    "com.android.systemui",
    "com.android.shell",
    "com.android.providers.settings",
]


def _num(value: str) -> int:
    return int(float(value))


def _usage(cmd: str) -> Output:
    return Output().err(f"Error: Invalid arguments for command: {cmd}\n", 1)


def input_text_argument(arg: str) -> str:
    """What Android's `input text ARG` types: ARG with every `%s` turned into a space.

    The same left-to-right, non-overlapping replacement as AOSP's InputShellCommand.sendText:
    there is no escape for a literal `%s` (`%%s` types `% `), so a driver that sends one types a
    space instead, here as on a real phone.
    """
    return arg.replace("%s", " ")


# What Android 11+'s `input text` dies with when a character has no key on the virtual
# keyboard's key map (KeyCharacterMap.getEvents returns null): é, ß, CJK, emoji…
_TEXT_NPE = (
    "Exception occurred while executing 'text':\n"
    "java.lang.NullPointerException: Attempt to get length of null array\n"
    "\tat com.android.server.input.InputShellCommand.sendText(InputShellCommand.java:339)\n"
    "\tat com.android.server.input.InputShellCommand.runText(InputShellCommand.java:322)\n"
    "\tat com.android.server.input.InputShellCommand.onCommand(InputShellCommand.java:163)\n"
    "\tat com.android.modules.utils.BasicShellCommandHandler.exec"
    "(BasicShellCommandHandler.java:97)\n"
)


def _injection_refused(cmd: str) -> str:
    """What Android 11+'s `input CMD` prints on a phone that refuses injected input."""
    return (
        f"\nException occurred while executing '{cmd}':\n"
        "java.lang.SecurityException: Injecting input events requires the caller (or the "
        "source of the instrumentation, if any) to have the INJECT_EVENTS permission.\n"
        "\tat com.android.server.input.InputManagerService.injectInputEventToTarget"
        "(InputManagerService.java:911)\n"
        "\tat com.android.server.input.InputShellCommand.onCommand(InputShellCommand.java:257)\n"
        "\tat com.android.modules.utils.BasicShellCommandHandler.exec"
        "(BasicShellCommandHandler.java:97)\n"
    )


@registry.tool("input")
def _input(sh: Session, args: list[str], stdin: bytes) -> Output:
    phone = sh.phone
    sources = {
        "touchscreen",
        "touchpad",
        "keyboard",
        "mouse",
        "dpad",
        "gamepad",
        "stylus",
        "trackball",
    }
    while args and (args[0] in sources or args[0] == "-d"):
        args = args[2:] if args[0] == "-d" else args[1:]
    if not args:
        return Output().err("Usage: input [<source>] [-d DISPLAY_ID] <command> [<arg>...]\n", 1)
    cmd, rest = args[0], args[1:]
    if phone.refuse_injected_input:
        return Output().err(_injection_refused(cmd), 255)
    try:
        if cmd == "tap" and len(rest) == 2:
            phone.tap(_num(rest[0]), _num(rest[1]))
        elif cmd in ("swipe", "draganddrop") and len(rest) in (4, 5):
            x1, y1, x2, y2 = (_num(v) for v in rest[:4])
            duration = _num(rest[4]) if len(rest) == 5 else 300
            # The finger takes its time, as `input swipe` does on a phone.
            sh.wait(max(0, duration) / 1000)
            phone.swipe(x1, y1, x2, y2, duration)
        elif cmd == "text" and rest:
            if not rest[0].isascii():
                # The virtual keyboard's key map has no keys for it: nothing is typed.
                return Output().err(_TEXT_NPE, 255)
            phone.input_text(input_text_argument(rest[0]))
        elif cmd == "keyevent" and rest:
            codes = [c for c in rest if not c.startswith("--")]
            for code in codes:
                if not phone.press_key(code):
                    return Output().err(f"Error: Unknown keycode: {code}\n", 1)
        elif cmd == "longpress" and len(rest) in (2, 3):
            # Not in AOSP's `input`; some vendor builds have it, and scripts use it.
            phone.long_press(_num(rest[0]), _num(rest[1]))
        elif cmd == "press":
            phone.press_key("DPAD_CENTER")
        elif cmd == "roll":
            pass
        else:
            return _usage(cmd)
    except ValueError:
        return _usage(cmd)
    return Output()


@registry.tool("wm")
def _wm(sh: Session, args: list[str], stdin: bytes) -> Output:
    p = sh.phone
    if args[:1] == ["size"] and len(args) == 1:
        # The natural size in every rotation, as on a real phone (dumps and `input` rotate).
        pw, ph = p.physical_size
        out = f"Physical size: {pw}x{ph}\n"
        if p.override_size is not None:
            out += f"Override size: {p.natural_width}x{p.natural_height}\n"
        return Output().out(out)
    if args[:1] == ["size"]:
        if args[1] == "reset":
            p.set_display_size(None)
            return Output()
        m = re.fullmatch(r"(\d+)x(\d+)", args[1])
        if m is None or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
            return Output().err(f"Error: bad size {args[1]}\n", 255)
        p.set_display_size((int(m.group(1)), int(m.group(2))))
        return Output()
    if args[:1] == ["density"]:
        return Output().out("Physical density: 420\n")
    if args[:1] == ["dismiss-keyguard"] and p.sdk >= 26:
        p.dismiss_keyguard()
        return Output()
    if p.sdk < 26:
        # Android 8 (API 26) added dismiss-keyguard. Older `wm` (BaseCommand.showError) prints
        # its usage and the error to stderr and exits 0.
        op = args[0] if args else ""
        error = f"\nError: unknown command '{op}'\n" if op else ""
        return Output().err(_WM_USAGE_OLD + error, 0 if op else 1)
    return Output().err("usage: wm [size|density|dismiss-keyguard] ...\n", 255)


# Android 7's `wm` usage (Wm.onShowUsage), first lines.
_WM_USAGE_OLD = (
    "usage: wm [subcommand] [options]\n"
    "       wm size [reset|WxH|WdpxHdp]\n"
    "       wm density [reset|DENSITY]\n"
    "       wm overscan [reset|LEFT,TOP,RIGHT,BOTTOM]\n"
    "       wm scaling [off|auto]\n"
    "       wm screen-capture [userId] [true|false]\n"
)


# What AOSP's screencap writes (to stderr, which `exec-out` and plain `shell` merge into the
# image's stream) when several displays exist and no `-d` picks one.
MULTI_DISPLAY_WARNING = (
    "[Warning] Multiple displays were found, but no display id was specified! Defaulting to "
    "the first display found, however this default is not guaranteed to be consistent across "
    "captures. A display id should be specified.\n"
    "A display ID can be specified with the [-d display-id] option.\n"
    'See "dumpsys SurfaceFlinger --display-id" for valid display IDs.\n'
)


@registry.tool("screencap")
def _screencap(sh: Session, args: list[str], stdin: bytes) -> Output:
    png = "-p" in args
    files = [a for a in args if not a.startswith("-") and not a.isdigit()]
    result = Output()
    if sh.phone.screencap_linker_warning:
        result.err(sh.phone.screencap_linker_warning + "\n")
    if sh.phone.multi_display and "-d" not in args:
        result.err(MULTI_DISPLAY_WARNING)
    if files and files[0].endswith(".png"):
        png = True
    garbled = sh.phone.take_garbled_shot(png=True) if png else None
    if garbled is not None:
        data = garbled
    elif png:
        data = sh.phone.screencap_png()
    else:
        rgba = sh.phone.screencap_image().convert("RGBA")
        data = struct.pack("<IIII", rgba.width, rgba.height, 1, 0) + rgba.tobytes()
    if files:
        sh.phone.files.write(files[0], data)
        return result
    return result.out(data)


# What `uiautomator dump` dies with while another UiAutomation client (a uiautomator2 server,
# Appium) holds the accessibility bridge (Android's own missing space before "already").
BRIDGE_TAKEN = (
    "java.lang.IllegalStateException: UiAutomationService "
    "android.accessibilityservice.IAccessibilityServiceClient$Stub$Proxy@4ec8a91"
    "already registered!\n"
    "\tat android.app.UiAutomationConnection.connect(UiAutomationConnection.java:101)\n"
    "\tat android.app.UiAutomation.connect(UiAutomation.java:262)\n"
    "\tat com.android.uiautomator.core.UiAutomationShellWrapper.connect"
    "(UiAutomationShellWrapper.java:27)\n"
    "\tat com.android.commands.uiautomator.DumpCommand.run(DumpCommand.java:84)\n"
    "\tat com.android.commands.uiautomator.Launcher.main(Launcher.java:83)\n"
)


#: How long a killed dumper takes to exit.
_KILLED_EXIT_S = 0.3


def _hang(sh: Session, seconds: float) -> bool:
    """A dumper waiting `seconds` for an idle screen, as its own `uiautomator` process: the
    adb client hanging up does not end it (on a phone it runs on under adbd), `kill` does,
    and so does the cable being pulled. True when it was killed."""
    phone = sh.phone
    stop = threading.Event()
    proc = phone.processes.spawn("uiautomator", "shell", stop, pid=sh.exec_pid)
    phone.dumper = proc
    try:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and phone.online:
            if stop.wait(min(left, 0.05)):
                # A killed process exits a moment after the signal, as on a phone: until then
                # it still holds the bridge and shows in `pidof`.
                time.sleep(_KILLED_EXIT_S)
                return True
        return False
    finally:
        phone.dumper = None
        phone.processes.exited(proc)


# What MIUI's runtime prints as any app_process tool starts (`uiautomator` too): its Resources
# look for a theme file the phone does not have and print the exception, before the tool's own
# output on the same stream (seen on Xiaomi, Redmi and POCO phones; TencentQQGYLab/AppAgent#101).
MIUI_THEME_TRACE = (
    "java.io.FileNotFoundException: /data/system/theme_config/theme_compatibility.xml: "
    "open failed: ENOENT (No such file or directory)\n"
    "\tat libcore.io.IoBridge.open(IoBridge.java:575)\n"
    "\tat java.io.FileInputStream.<init>(FileInputStream.java:160)\n"
    "\tat java.io.FileInputStream.<init>(FileInputStream.java:115)\n"
    "\tat java.io.FileReader.<init>(FileReader.java:58)\n"
    "\tat miui.content.res.ThemeCompatibilityLoader.getVersion(ThemeCompatibilityLoader.java:108)\n"
    "\tat miui.content.res.ThemeCompatibility.<clinit>(ThemeCompatibility.java:31)\n"
    "\tat android.content.res.MiuiResourcesImpl.<clinit>(MiuiResourcesImpl.java:41)\n"
    "\tat android.content.res.Resources.getSystem(Resources.java:233)\n"
    "\tat com.android.internal.os.RuntimeInit.main(RuntimeInit.java:338)\n"
)


@registry.tool("uiautomator")
def _uiautomator(sh: Session, args: list[str], stdin: bytes) -> Output:
    result = _uiautomator_run(sh, args)
    if sh.phone.miui_theme_trace:
        result.chunks.insert(0, (2, MIUI_THEME_TRACE.encode()))
    return result


def _uiautomator_run(sh: Session, args: list[str]) -> Output:
    if not args or args[0] != "dump":
        return Output().err("Usage: uiautomator <subcommand> [options]\n", 1)
    files = [a for a in args[1:] if not a.startswith("-")]
    target = files[0] if files else "/sdcard/window_dump.xml"
    phone = sh.phone
    if phone.sdk <= 17 and args[1:]:
        # Android 4.1-4.2's DumpCommand takes its first argument for the file, whatever it
        # is (`new File(args[0])`), relative to the shell's `/`; it dumps the active window.
        target = args[1] if args[1].startswith("/") else f"/{args[1]}"
        args = args[:1]
    # `/` is read-only: the dumper's FileWriter fails, it logs that and reports all the same.
    unwritable = target.rfind("/") == 0
    if phone.dumper is not None:
        # An earlier dumper still holds the accessibility bridge (see `hang_dumps`).
        return Output().err(BRIDGE_TAKEN, 1)
    hang = phone.take_dump_hang()
    if hang is not None and _hang(sh, hang):
        return Output().err("Killed\n", 137)
    try:
        if "--windows" in args[1:]:
            xml = sh.phone.dump_windows().encode()
        else:
            xml = sh.phone.dump_hierarchy().encode()
    except IdleStateError:
        return Output().err("ERROR: could not get idle state.\n")
    except NullRootError:
        return Output().err("ERROR: null root node returned by UiTestAutomationBridge.\n")
    except NoWindowsError:
        # AOSP's dumpWindowsToFile returns before creating the file; DumpCommand still reports.
        return Output().out(f"UI hierchary dumped to: {target}\n")
    except DumpKilled as exc:
        return Output().err(f"{exc.word}\n", exc.code)
    except BridgeTaken:
        return Output().err(BRIDGE_TAKEN, 1)
    except DumpCrashed:
        # The dumper had opened its file before it threw; the trace went to logcat only.
        if target != "/dev/tty":
            sh.phone.files.write(target, b"")
        return Output(code=1)
    result = Output()
    if phone.storage_left is not None and target != "/dev/tty":
        xml = xml[: phone.storage_left]  # what fitted; the write error went to logcat
    if target == "/dev/tty":
        result.out(xml)
    elif unwritable:
        pass
    elif not sh.phone.files.write(target, xml):
        return result.err(f"ERROR: could not write {target}\n", 1)
    return result.out(f"UI hierchary dumped to: {target}\n")


def _component(text: str) -> tuple[str, str] | None:
    pkg, sep, cls = text.partition("/")
    if not sep or not pkg or not cls:
        return None
    return pkg, (pkg + cls if cls.startswith(".") else cls)


@registry.tool("am")
def _am(sh: Session, args: list[str], stdin: bytes) -> Output:
    phone = sh.phone
    if not args:
        return Output().err("usage: am [subcommand] [options]\n", 1)
    cmd, rest = args[0], args[1:]
    if cmd in ("force-stop", "kill"):
        for pkg in (a for a in rest if not a.startswith("-")):
            phone.force_stop(pkg)
        return Output()
    if cmd == "broadcast" and "ADB_KEYBOARD" in " ".join(rest):
        return _adb_keyboard(sh, rest)
    if cmd == "broadcast":
        action = (
            rest[rest.index("-a") + 1] if "-a" in rest and rest.index("-a") + 1 < len(rest) else ""
        )
        return Output().out(
            f"Broadcasting: Intent {{ act={action} }}\nBroadcast completed: result=0\n"
        )
    if cmd not in ("start", "start-activity"):
        return Output().err(f"Error: Unknown command: {cmd}\n", 1)
    opts: dict[str, str] = {}
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in ("-n", "-a", "-c", "-d", "-f", "--user", "-t"):
            opts[a] = rest[i + 1] if i + 1 < len(rest) else ""
            i += 2
            continue
        if a == "-S" and "-n" in rest:
            comp = _component(rest[rest.index("-n") + 1])
            if comp:
                phone.force_stop(comp[0])
        i += 1
    comp = _component(opts["-n"]) if "-n" in opts else ACTION_PAGES.get(opts.get("-a", ""))
    if comp is None:
        return Output().err("Error: Activity not started, unable to resolve Intent\n", 1)
    pkg, cls = comp
    intent = f"cmp={pkg}/{cls.removeprefix(pkg)}" if "-n" in opts else f"act={opts['-a']}"
    result = Output().out(f"Starting: Intent {{ {intent} }}\n")
    if not phone.start_activity(pkg, cls):
        return result.err(
            f"Error type 3\nError: Activity class {{{pkg}/{cls}}} does not exist.\n", 1
        )
    return result


@registry.tool("monkey")
def _monkey(sh: Session, args: list[str], stdin: bytes) -> Output:
    pkgs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-p"]
    if not pkgs:
        return Output().err("** Error: no package given\n", 1)
    result = Output()
    for arg in args:
        result.out(f"  bash arg: {arg}\n")
    pkg = pkgs[0]
    if pkg == sh.phone.launcher_package or not sh.phone.launch(pkg):
        return result.out("** No activities found to run, monkey aborted.\n").err("", 252)
    return result.out(
        "Events injected: 1\n"
        "## Network stats: elapsed time=12ms (0ms mobile, 0ms wifi, 12ms not connected)\n"
    )


def _props(sh: Session) -> dict[str, str]:
    p = sh.phone
    return {
        "ro.product.model": p.model,
        "ro.product.brand": "amc",
        "ro.product.manufacturer": "amc",
        "ro.product.name": "amc_virtual",
        "ro.product.device": "amc_virtual",
        "ro.product.cpu.abi": "arm64-v8a",
        "ro.build.version.sdk": str(p.sdk),
        "ro.build.version.release": p.release,
        "ro.build.id": "AMC.241129.001",
        "ro.build.type": "user",
        "ro.build.characteristics": "default",
        "ro.build.fingerprint": (
            f"amc/amc_virtual/amc_virtual:{p.release}/AMC.241129.001/1:user/release-keys"
        ),
        "ro.serialno": p.serial,
        "sys.boot_completed": "" if p.system_server_down else "1",
        "ro.sf.lcd_density": "420",
        "persist.sys.locale": p.locale,
        "ro.product.locale": p.locale,
        "ro.com.android.dateformat": "MM-dd-yyyy",
    }


@registry.tool("getprop")
def _getprop(sh: Session, args: list[str], stdin: bytes) -> Output:
    props = _props(sh)
    if args:
        return Output().out(props.get(args[0], args[1] if len(args) > 1 else "") + "\n")
    return Output().out("".join(f"[{k}]: [{v}]\n" for k, v in sorted(props.items())))


@registry.tool("pm")
def _pm(sh: Session, args: list[str], stdin: bytes) -> Output:
    ime = sh.phone.keyboard_package
    packages = sorted({*sh.phone.apps, *EXTRA_PACKAGES, *sh.phone.installed, ime})
    if args[:1] == ["install"]:
        return _pm_install(sh, args[1:])
    if args[:1] == ["uninstall"] and len(args) > 1:
        if args[-1] in sh.phone.installed:
            sh.phone.installed.discard(args[-1])
            return Output().out("Success\n")
        return Output().out("Failure [DELETE_FAILED_INTERNAL_ERROR]\n").err("", 1)
    if args[:2] == ["list", "packages"]:
        needle = next((a for a in args[2:] if not a.startswith("-")), "")
        return Output().out("".join(f"package:{pkg}\n" for pkg in packages if needle in pkg))
    if args[:1] == ["path"] and len(args) > 1:
        if args[1] in sh.phone.apps:
            name = args[1].rsplit(".", 1)[-1].capitalize()
            return Output().out(f"package:/system/priv-app/{name}/{name}.apk\n")
        return Output(code=1)
    if args[:1] == ["clear"]:
        return Output().out("Success\n")
    return Output().err("Error: unsupported pm command on this phone\n", 1)


# `settings` namespace/key → the phone setting behind it. Booleans read "1"/"0" (dark theme,
# `ui_night_mode`, reads "2"/"1"); numbers and choices convert as the real provider stores them.
_SETTING_KEYS = {
    ("global", "airplane_mode_on"): "airplane_mode",
    ("global", "wifi_on"): "wifi",
    ("global", "bluetooth_on"): "bluetooth",
    ("global", "low_power"): "battery_saver",
    ("global", "zen_mode"): "do_not_disturb",
    ("global", "auto_time"): "auto_time",
    ("system", "accelerometer_rotation"): "auto_rotate",
    ("system", "screen_brightness_mode"): "adaptive_brightness",
    ("system", "screen_brightness"): "brightness",
    ("system", "screen_off_timeout"): "screen_timeout",
    ("system", "font_scale"): "font_size",
    ("system", "time_12_24"): "use_24_hour_format",
    ("system", "status_bar_show_battery_percent"): "battery_percentage",
    ("secure", "location_mode"): "location",
    ("secure", "accessibility_display_inversion_enabled"): "color_inversion",
    ("secure", "ui_night_mode"): "dark_theme",
}
_TIMEOUTS_MS = {
    "15 seconds": 15_000,
    "30 seconds": 30_000,
    "1 minute": 60_000,
    "2 minutes": 120_000,
    "5 minutes": 300_000,
    "10 minutes": 600_000,
    "30 minutes": 1_800_000,
}
_FONT_SCALES = {"Small": "0.85", "Default": "1.0", "Large": "1.15", "Largest": "1.3"}
# The selected keyboard: the phone's own (`VirtualPhone.keyboard_ime`) unless one was set.
_INPUT_METHOD = "secure/default_input_method"
_READ_ONLY = {
    "secure/android_id": "a1b2c3d4e5f60718",
    "global/device_name": "",
    "global/adb_enabled": "1",
    "global/development_settings_enabled": "1",
    "global/stay_on_while_plugged_in": "0",
    "system/volume_music": "9",
}


def _setting_text(key: str, value: object, name: str) -> str:
    if key == "brightness":
        return str(int(value))  # type: ignore[call-overload]
    if key == "screen_timeout":
        return str(_TIMEOUTS_MS.get(str(value), 30_000))
    if key == "font_size":
        return _FONT_SCALES.get(str(value), "1.0")
    if key == "use_24_hour_format":
        return "24" if value else "12"
    if key == "location":
        return "3" if value else "0"
    if name == "ui_night_mode":
        return "2" if value else "1"
    return "1" if value else "0"


def _setting_value(key: str, text: str, name: str) -> object | None:
    """A `settings put` value as the phone stores it, or None if it is not one."""
    try:
        if key == "brightness":
            return max(0, min(255, int(text)))
        if key == "screen_timeout":
            ms = int(text)
            return min(_TIMEOUTS_MS, key=lambda k: abs(_TIMEOUTS_MS[k] - ms))
        if key == "font_size":
            scale = float(text)
            return min(_FONT_SCALES, key=lambda k: abs(float(_FONT_SCALES[k]) - scale))
        if key == "use_24_hour_format":
            return text == "24"
        if name == "ui_night_mode":
            return text == "2"
        return int(text) != 0
    except ValueError:
        return None


IME_ADB_KEYBOARD = "com.github.uiautomator/.AdbKeyboard"
INSTALLABLE = ["com.github.uiautomator"]  # APKs whose behaviour this phone can emulate


def _ime_list(sh: Session) -> list[str]:
    imes = [sh.phone.keyboard_ime]
    if "com.github.uiautomator" in sh.phone.installed:
        imes.append(IME_ADB_KEYBOARD)
    return imes


@registry.tool("ime")
def _ime(sh: Session, args: list[str], stdin: bytes) -> Output:
    extra = sh.phone.extra_settings
    if args[:1] == ["list"]:
        listed = Output().out("".join(f"{ime}\n" for ime in _ime_list(sh)))
        if sh.phone.helper_uninstalled_after_ime_lists > 0:
            sh.phone.helper_uninstalled_after_ime_lists -= 1
            if not sh.phone.helper_uninstalled_after_ime_lists:
                sh.phone.installed.discard("com.github.uiautomator")
        return listed
    if len(args) == 2 and args[0] in ("enable", "disable", "set"):
        if args[1] not in _ime_list(sh):
            return Output().err(f"Unknown input method {args[1]} cannot be selected\n", 1)
        if args[0] == "set":
            extra["secure/default_input_method"] = args[1]
            return Output().out(f"Input method {args[1]} selected for user #0\n")
        return Output().out(f"Input method {args[1]}: {args[0]}d\n")
    return Output().err("usage: ime [list|enable|disable|set] ...\n", 1)


def _apk_package(data: bytes) -> str | None:
    """The package of an APK, if it is one this phone knows how to run."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as apk:
            manifest = apk.read("AndroidManifest.xml")
    except (zipfile.BadZipFile, KeyError):
        return None
    return next((p for p in INSTALLABLE if p.encode("utf-16-le") in manifest), None)


def _pm_install(sh: Session, args: list[str]) -> Output:
    paths = [a for a in args if not a.startswith("-")]
    data = sh.phone.files.read(paths[-1]) if paths else None
    if data is None:
        return Output().out("Failure [INSTALL_FAILED_INVALID_URI]\n").err("", 1)
    package = _apk_package(data)
    if package is None:
        return (
            Output()
            .out("Failure [INSTALL_FAILED_INVALID_APK: the virtual phone runs only its own apps]\n")
            .err("", 1)
        )
    sh.phone.installed.add(package)
    return Output().out("Success\n")


@registry.tool("settings")
def _settings(sh: Session, args: list[str], stdin: bytes) -> Output:
    usage = "usage: settings [get|put|delete|list] NAMESPACE [KEY] [VALUE]\n"
    if len(args) < 2 or args[1] not in ("global", "system", "secure"):
        return Output().err(usage, 1)
    verb, space = args[0], args[1]
    s = sh.phone.state.settings
    extra = sh.phone.extra_settings
    if verb == "list":
        lines = dict(
            (k.split("/", 1)[1], v)
            for k, v in {**_READ_ONLY, _INPUT_METHOD: sh.phone.input_method, **extra}.items()
            if k.startswith(f"{space}/")
        )
        for (ns, listed), setting in _SETTING_KEYS.items():
            if ns == space:
                lines[listed] = _setting_text(setting, s.get(setting), listed)
        return Output().out("".join(f"{k}={v}\n" for k, v in sorted(lines.items())))
    if len(args) < 3 or verb not in ("get", "put", "delete"):
        return Output().err(usage, 1)
    name = args[2]
    key = _SETTING_KEYS.get((space, name))
    generic = f"{space}/{name}"
    if verb == "get":
        if key is not None:
            return Output().out(_setting_text(key, s.get(key), name) + "\n")
        if generic == _INPUT_METHOD:
            return Output().out(sh.phone.input_method + "\n")
        return Output().out(extra.get(generic, _READ_ONLY.get(generic, "null")) + "\n")
    if verb == "delete":
        extra.pop(generic, None)
        return Output().out("Deleted 1 rows\n")
    if len(args) < 4:
        return Output().err("usage: settings put NAMESPACE KEY VALUE\n", 1)
    if key is None:
        extra[generic] = args[3]
        return Output()
    value = _setting_value(key, args[3], name)
    if value is not None:
        s[key] = value  # type: ignore[assignment]
    return Output()


@registry.tool("svc")
def _svc(sh: Session, args: list[str], stdin: bytes) -> Output:
    keys = {"wifi": "wifi", "bluetooth": "bluetooth"}
    if len(args) == 2 and args[0] in keys and args[1] in ("enable", "disable"):
        sh.phone.state.settings[keys[args[0]]] = args[1] == "enable"
        return Output()
    return Output().err("usage: svc [wifi|bluetooth] [enable|disable]\n", 1)


def _adb_keyboard(sh: Session, args: list[str]) -> Output:
    """What the AdbKeyboard IME's broadcast receiver does once installed and selected."""
    action = args[args.index("-a") + 1] if "-a" in args[:-1] else ""
    extras = {args[i + 1]: args[i + 2] for i in range(len(args) - 2) if args[i] == "--es"}
    head = f"Broadcasting: Intent {{ act={action} flg=0x400000 (has extras) }}\n"
    selected = sh.phone.input_method == IME_ADB_KEYBOARD
    if not selected or IME_ADB_KEYBOARD not in _ime_list(sh) or sh.phone.adb_keyboard_unbound:
        return Output().out(head + "Broadcast completed: result=0\n")
    if action == "ADB_KEYBOARD_INPUT_TEXT":
        try:
            text = base64.b64decode(extras.get("text", "")).decode()
        except (binascii.Error, UnicodeDecodeError):
            return Output().out(head + 'Broadcast completed: result=0, data="bad base64"\n')
        sh.phone.input_text(text)
    elif action == "ADB_KEYBOARD_CLEAR_TEXT":
        sh.phone.clear_text()
    return Output().out(head + 'Broadcast completed: result=-1, data="success"\n')
