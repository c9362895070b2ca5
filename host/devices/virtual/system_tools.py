"""System commands a phone's shell has beside `input` and friends: `dumpsys`, `cmd`, `logcat`,
`log`, `ps`, `pidof`, `kill`, `which`, `ip`, `ifconfig`. Their output has the shape of
Android 14's (toybox for the process tools), which is what adbutils, uiautomator2 and our
drivers parse."""

from __future__ import annotations

from host.devices.virtual.commands import Output, Registry, Session
from host.devices.virtual.logbuffer import LEVELS, format_entry

registry = Registry()

#: Every command this shell knows lives in /system/bin (what `which` answers).
BIN = "/system/bin"
WLAN_IP = "192.168.1.23"
CHATTER_S = 0.25


def _activity(sh: Session) -> tuple[str, str]:
    pkg = sh.phone.current_package()
    cls = sh.phone.current_activity()
    short = "." + cls[len(pkg) + 1 :] if cls.startswith(pkg + ".") else cls
    return pkg, short


def _focus_window(sh: Session) -> str:
    """The focused window as `dumpsys window` names it: `pkg/activity` for an activity's
    window, its title for a system window (the shade, the lock screen, an ANR dialog)."""
    focused = next(s for s in sh.phone.surfaces() if s.focused)
    if focused.kind in ("app", "dialog"):
        return f"{focused.package}/{focused.activity}"
    if focused.kind == "anr":
        return f"Application Not Responding: {focused.package}"
    return focused.title


def _window_policy(sh: Session) -> str:
    p = sh.phone
    shown = "true" if p.locked else "false"
    secure = "true" if p.screen_lock == "pin" else "false"
    state = "SCREEN_STATE_ON" if p.awake else "SCREEN_STATE_OFF"
    interactive = "INTERACTIVE_STATE_AWAKE" if p.awake else "INTERACTIVE_STATE_SLEEP"
    return (
        "WINDOW MANAGER POLICY STATE (dumpsys window policy)\n"
        "    mSafeMode=false mSystemReady=true mSystemBooted=true\n"
        f"    mScreenOnEarly={str(p.awake).lower()} mScreenOnFully={str(p.awake).lower()}\n"
        "    mLidState=LID_ABSENT\n"
        "    KeyguardServiceDelegate\n"
        f"      showing={shown}\n"
        f"      showingAndNotOccluded={shown}\n"
        f"      inputRestricted={shown}\n"
        "      occluded=false\n"
        f"      secure={secure}\n"
        "      dreaming=false\n"
        "      systemIsReady=true\n"
        "      deviceHasKeyguard=true\n"
        "      enabled=true\n"
        "      offReason=OFF_BECAUSE_OF_USER\n"
        "      currentUser=0\n"
        "      bootCompleted=true\n"
        f"      screenState={state}\n"
        f"      interactiveState={interactive}\n"
        "      KeyguardStateMonitor\n"
        f"        mIsShowing={shown}\n"
        "        mSimSecure=false\n"
        f"        mInputRestricted={shown}\n"
        "        mTrusted=false\n"
        "        mCurrentUserId=0\n"
    )


def _last_anr(sh: Session) -> str:
    """`dumpsys window`'s first section: a snapshot of the window manager taken when the last
    "isn't responding" dialog came up, with that moment's focus and, after "Last ANR
    continued", a copy of the display contents (AOSP's saveANRStateLocked; kept 2 hours)."""
    focus = sh.phone.last_anr_focus
    head = "WINDOW MANAGER LAST ANR (dumpsys window lastanr)\n"
    if focus is None:
        return head + "  <no ANR has occurred since boot>\n\n"
    pkg, _, cls = focus.partition("/")
    short = "." + cls[len(pkg) + 1 :] if cls.startswith(pkg + ".") else cls
    return (
        head + "  ANR time: 12/7/26 6:10 PM\n"
        f"  Application at fault: ActivityRecord{{1b2c3d4 u0 {pkg}/{short} t42}}\n"
        "  Reason: Input dispatching timed out\n\n"
        f"  Window #0 Window{{9f8e7d6 u0 {focus}}}:\n"
        f"  mCurrentFocus=Window{{9f8e7d6 u0 {focus}}}\n"
        f"  mFocusedApp=ActivityRecord{{1b2c3d4 u0 {pkg}/{short} t42}}\n\n"
        "Last ANR continued\n"
        "WINDOW MANAGER DISPLAY CONTENTS (dumpsys window displays)\n"
        "  Display: mDisplayId=0 rootTasks=2\n"
        f"    mCurrentFocus=Window{{9f8e7d6 u0 {focus}}}\n"
        f"    mFocusedApp=ActivityRecord{{1b2c3d4 u0 {pkg}/{short} t42}}\n\n"
    )


@registry.tool("dumpsys")
def _dumpsys(sh: Session, args: list[str], stdin: bytes) -> Output:
    p = sh.phone
    service = args[0] if args else ""
    pkg, short = _activity(sh)
    if service == "window":
        if args[1:2] == ["policy"]:
            return Output().out(_window_policy(sh))
        if args[1:2] == ["lastanr"]:
            return Output().out(_last_anr(sh))
        # Without a section `dumpsys window` opens with the last ANR's snapshot.
        anr = _last_anr(sh) if len(args) == 1 else ""
        focus = _focus_window(sh)
        windows = "".join(
            f"  Window #{i} Window{{{0x7E1F0A2 + i:x} u0 {s.title}}}:\n"
            f"    mDisplayId=0 rootTaskId=12 mSession=Session{{4b1 4242:u0a10123}}\n"
            f"    mAttrs={{(0,0)(fillxfill) ty={s.type.removeprefix('TYPE_')} fmt=TRANSLUCENT}}\n"
            for i, s in enumerate(reversed(p.surfaces()))
        )
        current = (
            f"mCurrentFocus=Window{{7e1f0a2 u0 {focus}}}\n"
            f"  mFocusedApp=ActivityRecord{{5c3d9e1 u0 {pkg}/{short} t12}}\n"
        )
        if p.multi_display and p.sdk >= 29:
            # From Android 10 each display's block names its own focus, and the display that
            # has it is listed first: here the presentation on display 2 (a cast screen that
            # was touched last), before the phone's own display 0.
            presentation = "com.example.presentation/com.example.presentation.PresentationActivity"
            displays = (
                "WINDOW MANAGER DISPLAY CONTENTS (dumpsys window displays)\n"
                "  Display: mDisplayId=2 rootTasks=1\n"
                f"    mCurrentFocus=Window{{a3c01 u0 {presentation}}}\n"
                f"    mFocusedApp=ActivityRecord{{b2e7 u0 {presentation} t30}}\n"
                "  Display: mDisplayId=0 rootTasks=2\n"
                f"    {current.replace('  ', '    ')}"
            )
            return Output().out(
                anr
                + (displays if args[1:2] != ["windows"] else "")
                + "WINDOW MANAGER WINDOWS (dumpsys window windows)\n"
                + windows
                + "  mTopFocusedDisplayId=2\n"
                + (_window_policy(sh) if args[1:2] != ["windows"] else "")
            )
        return Output().out(
            anr
            + "WINDOW MANAGER WINDOWS (dumpsys window windows)\n"
            + windows
            + f"  {current}"
            + (_window_policy(sh) if args[1:2] != ["windows"] else "")
        )
    if service == "activity":
        sub = args[1] if len(args) > 1 else "activities"
        pid = p.processes.app_pid(pkg)
        # With a second display that has focus, its task is listed first (the focused
        # display is the root container's top child, and both dumps walk them top down).
        second = p.multi_display and p.sdk >= 29
        presentation = "com.example.presentation/.PresentationActivity"
        if sub == "top":
            other = f"TASK 30 id=30 userId=0\n  ACTIVITY {presentation} b2e7 pid=4300\n"
            return Output().out(
                (other if second else "")
                + f"TASK 12 id=12 userId=0\n  ACTIVITY {pkg}/{short} 5c3d9e1 pid={pid}\n"
            )
        other = (
            "Display #2 (activities from top to bottom):\n"
            "  * Task{30 #30 type=standard A=10200:com.example.presentation U=0 visible=true"
            " mode=fullscreen}\n"
            f"    mResumedActivity: ActivityRecord{{b2e7 u0 {presentation} t30}}\n"
            f"  ResumedActivity: ActivityRecord{{b2e7 u0 {presentation} t30}}\n"
        )
        return Output().out(
            "ACTIVITY MANAGER ACTIVITIES (dumpsys activity activities)\n"
            + (other if second else "")
            + "Display #0 (activities from top to bottom):\n"
            f"  * Task{{12 #12 type=standard A=10123:{pkg} U=0 visible=true mode=fullscreen}}\n"
            f"    mResumedActivity: ActivityRecord{{5c3d9e1 u0 {pkg}/{short} t12}}\n"
            f"  ResumedActivity: ActivityRecord{{5c3d9e1 u0 {pkg}/{short} t12}}\n"
        )
    if service == "SurfaceFlinger":
        if args[1:2] == ["--display-id"] and p.sdk >= 29:
            return Output().out(
                "Display 4619827259835644672 (HWC display 0): port=0 pnpId=GGL "
                'displayName="EMU_display_0"\n'
            )
        # Before Android 10 SurfaceFlinger knows no options: it dumps its whole state.
        return Output().out(
            "Build configuration: [sf PRESENT_TIME_OFFSET=0 FORCE_HWC_FOR_RBG_TO_YUV=0 "
            "MAX_VIRT_DISPLAY_DIM=0 RUNNING_WITHOUT_SYNC_FRAMEWORK=0 "
            "NUM_FRAMEBUFFER_SURFACE_BUFFERS=3] [libui] [libgui]\n"
            f"Visible layers (count = {len(p.surfaces())})\n"
        )
    if service == "display":
        # The viewport in the current rotation (what adbutils' `rotation()` reads).
        w, h = p.width, p.height
        orientation = f"orientation={p.rotation}, " if p.display_dump_orientation else ""
        # A second display's viewport is listed first, as Android 14 lists an external one.
        external = (
            "DisplayViewport{type=EXTERNAL, valid=true, isActive=true, displayId=2, "
            "uniqueId='local:1', physicalPort=1, orientation=0, deviceWidth=1920, "
            "deviceHeight=1080}, "
            if p.multi_display
            else ""
        )
        return Output().out(
            "DISPLAY MANAGER (dumpsys display)\n"
            f"  mViewports=[{external}DisplayViewport{{type=INTERNAL, valid=true, isActive=true, "
            f"displayId=0, uniqueId='local:0', physicalPort=0, {orientation}"
            f"logicalFrame=Rect(0, 0 - {w}, {h}), "
            f"physicalFrame=Rect(0, 0 - {w}, {h}), deviceWidth={w}, deviceHeight={h}}}]\n"
            f"  mScreenState={'ON' if p.awake else 'OFF'}\n"
        )
    if service == "input":
        return Output().out(
            "INPUT MANAGER (dumpsys input)\n\nInput Reader State:\n"
            "  Device 2: virtio_input_multi_touch_1\n"
            "    Touch Input Mapper (mode - DIRECT):\n"
            f"      SurfaceOrientation: {p.rotation}\n"
        )
    if service == "power":
        on = "true" if p.awake else "false"
        return Output().out(
            "POWER MANAGER (dumpsys power)\n"
            "Power Manager State:\n"
            f"  mWakefulness={'Awake' if p.awake else 'Asleep'}\n"
            f"  mWakefulnessChanging=false\n  mIsPowered=true\n  mPlugType=2\n"
            f"  mHoldingWakeLockSuspendBlocker=false\n"
            f"  mHoldingDisplaySuspendBlocker={on}\n"
            "Display Power: state=" + ("ON" if p.awake else "OFF") + "\n"
        )
    if service == "input_method":
        shown = "true" if p.keyboard_shown() else "false"
        return Output().out(
            "Current Input Method Manager state:\n"
            f"  mCurMethodId={p.input_method}\n"
            f"  mCurFocusedWindowClient=ClientState{{{pkg}}}\n"
            f"  mInputShown={shown}\n"
            f"  mShowRequested={shown} mShowExplicitlyRequested=false mShowForced=false\n"
        )
    if service == "battery":
        return Output().out(
            "Current Battery Service state:\n  AC powered: false\n  USB powered: true\n"
            f"  present: true\n  level: {p.state.battery_level}\n  scale: 100\n  status: 2\n"
            "  health: 2\n  temperature: 250\n  voltage: 4100\n  technology: Li-ion\n"
        )
    if service == "package" and len(args) > 1 and args[1] in p.apps:
        return Output().out(
            f"Packages:\n  Package [{args[1]}] (1a2b3c):\n"
            "    versionCode=34 minSdk=28 targetSdk=34\n    versionName=14\n"
            "    pkgFlags=[ SYSTEM HAS_CODE ]\n"
        )
    return Output().out(f"Can't find service: {service}\n")


# --- cmd ----------------------------------------------------------------------------------------

_CMD_SERVICES = ["activity", "input", "package", "settings", "statusbar", "uimode", "wifi"]


@registry.tool("cmd")
def _cmd(sh: Session, args: list[str], stdin: bytes) -> Output:
    """`cmd SERVICE …`: Binder shell commands. Services whose command line tool this shell
    already has (`am`, `input`, `pm`, `settings`) run it; `uimode night`, `statusbar` and `wifi`
    act on the phone."""
    p = sh.phone
    if not args:
        return Output().err("cmd: No service specified; use -l to list all services\n", 20)
    if args[0] == "-l":
        return Output().out(
            "Currently running services:\n" + "".join(f"  {s}\n" for s in _CMD_SERVICES)
        )
    service, rest = args[0], args[1:]
    alias = {"activity": "am", "input": "input", "package": "pm", "settings": "settings"}
    if service in alias:
        tool = sh.command(alias[service])
        assert tool is not None
        return tool(sh, rest, stdin)
    if service == "uimode" and rest[:1] == ["night"]:
        s = p.state.settings
        if len(rest) == 1:
            return Output().out(f"Night mode: {'yes' if s['dark_theme'] else 'no'}\n")
        if rest[1] in ("yes", "no", "auto"):
            s["dark_theme"] = rest[1] == "yes"
            return Output().out(f"Night mode: {'yes' if s['dark_theme'] else 'no'}\n")
        return Output().err("Error: mode must be 'yes', 'no', 'auto' or 'custom_schedule'\n", 255)
    if service == "statusbar":
        sub = rest[:1]
        if sub == ["expand-notifications"]:
            p.open_shade()
        elif sub == ["expand-settings"]:
            p.open_shade(quick_settings=True)
        elif sub == ["collapse"]:
            p.close_shade()
        else:
            return Output().err(
                "usage: cmd statusbar [expand-notifications|expand-settings|collapse]\n", 255
            )
        return Output()
    if service == "wifi" and rest[:1] == ["set-wifi-enabled"] and len(rest) == 2:
        p.state.settings["wifi"] = rest[1] == "enabled"
        return Output()
    if service == "wifi" and rest[:1] == ["status"]:
        on = p.state.flag("wifi")
        return Output().out("Wifi is enabled\n" if on else "Wifi is disabled\n")
    if service in _CMD_SERVICES:
        return Output().err(f"Unknown command: {' '.join(rest)}\n", 255)
    return Output().err(f"cmd: Can't find service: {service}\n", 20)


# --- logs -----------------------------------------------------------------------------------


@registry.tool("log")
def _log(sh: Session, args: list[str], stdin: bytes) -> Output:
    """`log [-p PRIORITY] [-t TAG] MESSAGE`: write one entry to the main log."""
    level, tag, words = "I", "log", []
    i = 0
    while i < len(args):
        if args[i] in ("-p", "-t") and i + 1 < len(args):
            if args[i] == "-p":
                level = args[i + 1][:1].upper()
            else:
                tag = args[i + 1]
            i += 2
            continue
        words.append(args[i])
        i += 1
    if level not in LEVELS:
        return Output().err(f"log: invalid priority '{level}'\n", 1)
    sh.phone.log.write(level, tag, " ".join(words), pid=4242)
    return Output()


@registry.tool("logcat")
def _logcat(sh: Session, args: list[str], stdin: bytes) -> Output:
    """`logcat [-d] [-c|--clear] [-v FORMAT] [-t N] [TAG:LEVEL… *:S]`: print the log, and
    without -d keep following it until the caller hangs up (a phone's log never stays quiet:
    the system keeps writing, so readers see lines keep coming)."""
    buf = sh.phone.log
    fmt, dump, tail = "threadtime", False, 0
    filters: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-c", "--clear"):
            buf.clear()
            return Output()
        if a == "-d":
            dump = True
        elif a in ("-v", "-t", "-b", "-T") and i + 1 < len(args):
            if a == "-v":
                fmt = args[i + 1]
            elif a in ("-t", "-T") and args[i + 1].isdigit():
                tail = int(args[i + 1])
            i += 2
            continue
        elif ":" in a:
            tag, _, level = a.partition(":")
            filters[tag] = level.upper()[:1] or "V"
        i += 1

    def shown(level: str, tag: str) -> bool:
        floor = filters.get(tag, filters.get("*", "V"))
        return floor != "S" and LEVELS.index(level) >= LEVELS.index(
            floor if floor in LEVELS else "V"
        )

    entries = [e for e in buf.entries() if shown(e.level, e.tag)]
    if tail:
        entries = entries[-tail:]
    text = "".join(format_entry(e, fmt) for e in entries)
    if dump:
        return Output().out(text)
    result = Output()
    live = sh.live
    if live is not None:
        live(1, text.encode())
    else:
        result.out(text)
    last = buf.last_seq
    while not sh.cancel.is_set() and sh.phone.online:
        fresh = buf.wait_for(last, CHATTER_S)
        if not fresh:
            buf.write(
                "D",
                "BatteryService",
                f"Processing new values: level={sh.phone.state.battery_level}",
            )
            continue
        last = fresh[-1].seq
        chunk = "".join(format_entry(e, fmt) for e in fresh if shown(e.level, e.tag)).encode()
        if live is not None:
            live(1, chunk)
        else:
            result.out(chunk)
    return result


# --- processes ------------------------------------------------------------------------------


def _rows(sh: Session) -> list[tuple[int, int, str, str]]:
    p = sh.phone
    return p.processes.rows(p.running_packages(), p.launcher_package)


@registry.tool("ps")
def _ps(sh: Session, args: list[str], stdin: bytes) -> Output:
    """toybox `ps`: `-A` every process, `-u USER` one user's, no option the shell's own."""
    rows = _rows(sh)
    if "-u" in args[:-1]:
        user = args[args.index("-u") + 1]
        rows = [r for r in rows if r[2] == user]
    elif "-A" not in args and "-e" not in args:
        rows = [r for r in rows if r[2] == "shell"]
    rows = [*rows, (4242, 4000, "shell", "sh"), (4243, 4242, "shell", "ps")]
    head = "USER            PID   PPID     VSZ    RSS WCHAN            ADDR S NAME\n"
    lines = "".join(
        f"{user:<12}{pid:>7}{ppid:>7}{12_345_678:>8}{98_304:>7} {'do_epoll_wait':<16}  0 S {name}\n"
        for pid, ppid, user, name in rows
    )
    return Output().out(head + lines)


@registry.tool("pidof")
def _pidof(sh: Session, args: list[str], stdin: bytes) -> Output:
    names = [a for a in args if not a.startswith("-")]
    pids = [str(pid) for pid, _, _, name in _rows(sh) if name in names]
    if not pids:
        return Output(code=1)
    return Output().out(" ".join(pids) + "\n")


@registry.tool("kill")
def _kill(sh: Session, args: list[str], stdin: bytes) -> Output:
    """`kill [-9|-s SIG] PID…`: ends an app (like a force stop) or a program a shell started;
    system processes are not the shell user's to kill."""
    p = sh.phone
    targets = [
        a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "-s")
    ]
    if not targets:
        return Output().err("kill: usage: kill [-s SIGNAL | -SIGNAL] PID...\n", 1)
    result = Output()
    rows = {pid: (user, name) for pid, _, user, name in _rows(sh)}
    spawned = {proc.pid: proc for proc in p.processes.spawned()}
    for t in targets:
        if not t.isdigit() or int(t) not in rows:
            result.err(f"kill: pid {t}: No such process\n", 1)
            continue
        pid = int(t)
        if pid in spawned:
            spawned[pid].stop.set()
        elif rows[pid][1] in p.apps:
            p.force_stop(rows[pid][1])
        else:
            result.err(f"kill: pid {pid}: Operation not permitted\n", 1)
    return result


@registry.tool("which")
def _which(sh: Session, args: list[str], stdin: bytes) -> Output:
    found = [f"{BIN}/{a}\n" for a in args if sh.command(a) is not None]
    return Output(code=0 if found and len(found) == len(args) else 1).out("".join(found))


# --- network --------------------------------------------------------------------------------


def _wlan_up(sh: Session) -> bool:
    s = sh.phone.state
    return s.flag("wifi") and not s.flag("airplane_mode")


@registry.tool("ip")
def _ip(sh: Session, args: list[str], stdin: bytes) -> Output:
    """`ip addr [show [dev IFACE]]` and `ip route`: loopback, and wlan0 while Wi-Fi is on."""
    if args[:1] in (["route"], ["r"]):
        if not _wlan_up(sh):
            return Output()
        return Output().out(f"192.168.1.0/24 dev wlan0 proto kernel scope link src {WLAN_IP}\n")
    if args[:1] not in (["addr"], ["a"], ["address"]):
        return Output().err(
            'Object "' + (args[0] if args else "") + '" is unknown, try "ip help".\n', 1
        )
    dev = args[args.index("dev") + 1] if "dev" in args[:-1] else ""
    blocks = []
    if dev in ("", "lo"):
        blocks.append(
            "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN group default "
            "qlen 1000\n"
            "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"
            "    inet 127.0.0.1/8 scope host lo\n       valid_lft forever preferred_lft forever\n"
        )
    if dev in ("", "wlan0"):
        up = _wlan_up(sh)
        state = "UP" if up else "DOWN"
        block = (
            f"23: wlan0: <BROADCAST,MULTICAST{',UP,LOWER_UP' if up else ''}> mtu 1500 qdisc mq "
            f"state {state} group default qlen 3000\n"
            "    link/ether 02:00:00:44:55:66 brd ff:ff:ff:ff:ff:ff\n"
        )
        if up:
            block += (
                f"    inet {WLAN_IP}/24 brd 192.168.1.255 scope global wlan0\n"
                "       valid_lft forever preferred_lft forever\n"
            )
        blocks.append(block)
    if not blocks:
        return Output().err(f'Device "{dev}" does not exist.\n', 1)
    return Output().out("".join(blocks))


@registry.tool("ifconfig")
def _ifconfig(sh: Session, args: list[str], stdin: bytes) -> Output:
    dev = args[0] if args else "wlan0"
    if dev == "lo":
        return Output().out(
            "lo        Link encap:Local Loopback\n"
            "          inet addr:127.0.0.1  Mask:255.0.0.0\n"
            "          UP LOOPBACK RUNNING  MTU:65536  Metric:1\n"
        )
    if dev != "wlan0":
        return Output().err(f"ifconfig: {dev}: No such device\n", 1)
    if not _wlan_up(sh):
        return Output().out(
            "wlan0     Link encap:UNSPEC    Driver cnss_pci\n"
            "          BROADCAST MULTICAST  MTU:1500  Metric:1\n"
        )
    return Output().out(
        "wlan0     Link encap:UNSPEC    Driver cnss_pci\n"
        f"          inet addr:{WLAN_IP}  Bcast:192.168.1.255  Mask:255.255.255.0\n"
        "          UP BROADCAST RUNNING MULTICAST  MTU:1500  Metric:1\n"
    )
