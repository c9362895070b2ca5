"""Which window of a dump is what: the app, the system bars, a keyboard, a dialog, the shade.

A dump holds one tree per window: the top-level `<node>`s of a `<hierarchy>` (uiautomator2 and
androidx dump every window root side by side) or the `<window>` elements of
`uiautomator dump --windows` (which also say each window's type and layer). What a finger can
reach depends on what lies on top: a permission prompt, an "isn't responding" dialog, the
notification shade or the lock screen take every touch (they are *modal*: the app under them is
out of reach); a keyboard covers the bottom of the screen; the status and navigation bars are
system chrome the agent does not act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.scene import Bounds

Kind = Literal[
    "app",
    "status_bar",
    "navigation_bar",
    "system_ui",
    "keyboard",
    "permission_prompt",
    "app_not_responding",
    "app_crash",
    "system_dialog",
    "notification_shade",
    "lock_screen",
]

SYSTEM_UI = "com.android.systemui"
# Makers' permission prompts known by their package alone (MIUI's). AOSP's permission
# controller and package installer are not among them: they also show full-screen settings pages
# (Settings > Apps > … > Permissions), which are apps; their prompts are known by their buttons.
_PROMPT_PACKAGES = frozenset({"com.lbe.security.miui"})
# The buttons of a runtime permission prompt (AOSP's GrantPermissionsActivity: allow, allow
# while in use, allow once, deny, deny and don't ask again); makers' prompts keep the ids.
_PERMISSION_IDS = ("permission_allow", "permission_deny")
# Keyboards: any package naming an input method, plus well-known ones that do not.
_IME_HINTS = ("inputmethod", "keyboard", "honeyboard", "swiftkey", "touchtype", "gboard")
_SHADE_IDS = ("notification_panel", "quick_settings", "qs_frame", "notification_stack_scroller")
_LOCK_IDS = ("keyguard", "lock_icon", "bouncer", "lockscreen")
_ANR_TEXTS = ("isn't responding", "isn’t responding", "is not responding", "antwortet nicht")

#: Kinds that take every touch: whatever lies under them is out of reach.
MODAL: frozenset[Kind] = frozenset(
    {
        "permission_prompt",
        "app_not_responding",
        "app_crash",
        "system_dialog",
        "notification_shade",
        "lock_screen",
    }
)
#: System chrome: never acted on, never shown to the planner.
CHROME: frozenset[Kind] = frozenset({"status_bar", "navigation_bar"})
# Stacking when the dump does not give layers: higher is nearer the user.
_RANK: dict[Kind, int] = {
    "app": 0,
    "system_ui": 1,
    "status_bar": 2,
    "navigation_bar": 2,
    "keyboard": 3,
    "notification_shade": 4,
    "permission_prompt": 5,
    "system_dialog": 6,
    "app_crash": 6,
    "app_not_responding": 7,
    "lock_screen": 8,
}


@dataclass(frozen=True, slots=True)
class Window:
    """One window's tree in a dump."""

    index: int
    package: str
    bounds: Bounds
    #: AccessibilityWindowInfo type ("TYPE_INPUT_METHOD"…) when the dump says (--windows).
    type: str = ""
    layer: int | None = None
    title: str = ""
    #: Active or focused (--windows): the window the user is facing.
    focused: bool = False
    #: A `<window>` without a `<hierarchy>`: its root came back null (--windows).
    rootless: bool = False


@dataclass(frozen=True, slots=True)
class WindowFacts:
    """What the nodes of one window say about it (collected while parsing)."""

    resource_ids: tuple[str, ...]
    texts: tuple[str, ...]


def is_keyboard_package(package: str) -> bool:
    """The package names a keyboard (the fallback when the phone did not say which it has)."""
    low = package.lower()
    return any(h in low for h in _IME_HINTS)


def classify(
    window: Window,
    facts: WindowFacts,
    screen: tuple[int, int],
    ime_package: str = "",
    foreground: str = "",
) -> Kind:
    """The kind of a window, from its type, package, ids, texts and place on the screen.

    `ime_package` is the phone's selected keyboard (the driver's `keyboard_package`): a
    window of it is the keyboard when the dump gives no window type (uiautomator2's), as many
    keyboards' packages match no hint (`com.baidu.input_mi`, `com.tencent.wetype`). Where the
    dump has types (`--windows`), TYPE_INPUT_METHOD alone decides: the keyboard app's own
    settings screen is an app. Without types, the package hints do not make a keyboard of
    `foreground`, the app the driver says is in front (Gboard's settings screen)."""
    width, height = screen
    b = window.bounds
    if window.type:
        keyboard = window.type == "TYPE_INPUT_METHOD"
    else:
        by_setting = bool(ime_package) and window.package == ime_package
        by_hint = is_keyboard_package(window.package) and window.package != foreground
        keyboard = by_setting or by_hint
    if keyboard:
        return "keyboard"
    ids = [rid.rsplit("/", 1)[-1].lower() for rid in facts.resource_ids]
    prompt_ids = any(rid.startswith(_PERMISSION_IDS) for rid in ids)
    if prompt_ids or window.package in _PROMPT_PACKAGES:
        return "permission_prompt"
    if any(rid == "aerr_wait" for rid in ids) or any(
        a in t.lower() for t in facts.texts for a in _ANR_TEXTS
    ):
        return "app_not_responding"
    if any(rid.startswith("aerr_") for rid in ids):
        return "app_crash"
    if window.package == SYSTEM_UI:
        if any(h in rid for rid in ids for h in _LOCK_IDS):
            return "lock_screen"
        if b.height > height * 0.4 and any(h in rid for rid in ids for h in _SHADE_IDS):
            return "notification_shade"
        if b.top <= 0 and b.height < height * 0.15:
            return "status_bar"
        if b.bottom >= height and b.height < height * 0.15:
            return "navigation_bar"
        return "system_ui"
    if window.type == "TYPE_SYSTEM" and b.height < height * 0.15 and b.width >= width * 0.9:
        return "status_bar" if b.top <= 0 else "navigation_bar"
    if window.package == "android":
        return "system_dialog"
    return "app"


def stacking(window: Window, kind: Kind) -> tuple[int, int]:
    """Sort key, nearest the user last: the dump's layer when it has one, else the kind's
    usual place (a dialog over the shade over the keyboard over the app)."""
    if window.layer is not None:
        return (window.layer, _RANK[kind])
    return (_RANK[kind], -window.index)
