"""Read whether a phone's display is on and whether a lock screen is in the way.

Two system dumps say it, in forms that changed across Android versions (the same forms Appium's
lock management reads):

* `dumpsys power`: `mWakefulness=Awake|Asleep|Dozing|Dreaming` (some builds print
  `getWakefulnessLocked()=…`).
* `dumpsys window policy`: old releases print `mShowingLockscreen=true` /
  `mDreamingLockscreen=true`; newer ones a `KeyguardServiceDelegate` block with `showing=`,
  `showingAndNotOccluded=`, `secure=` and, inside it, a `KeyguardStateMonitor` block with
  `mIsShowing=`, `mSimSecure=` and `mTrusted=` (a trust agent keeps a secure lock open).

`SCREEN_STATE_COMMAND` fetches both in one `adb shell` round trip.
"""

from __future__ import annotations

import re

from host.devices.base import ScreenState

SCREEN_STATE_COMMAND = "dumpsys power | grep -i wakefulness; dumpsys window policy"
SDK_COMMAND = "getprop ro.build.version.sdk"
#: The first release with `wm dismiss-keyguard` (Android 8). Before it `wm` knows no such
#: command (it prints its usage and "Error: unknown command …"): a lock screen that needs no
#: credential goes with the MENU key (KEYCODE_MENU, 82) unless the maker turned that off
#: (config_disableMenuKeyInLockScreen), and always with a swipe up.
DISMISS_KEYGUARD_MIN_SDK = 26

_WAKEFULNESS = re.compile(r"^\s*(?:mWakefulness|getWakefulnessLocked\(\))=(\w+)", re.M)
_OLD_LOCK = re.compile(r"\bm(?:Showing|Dreaming)Lockscreen=true\b")
_FIELD = re.compile(r"^\s*(\w+)=(\S+)\s*$", re.M)


def parse_sdk(output: str) -> int | None:
    """The API level `SDK_COMMAND` printed; None when it printed no number."""
    text = output.strip()
    return int(text) if text.isdigit() else None


def has_dismiss_keyguard(sdk: int | None) -> bool:
    """Whether the phone's `wm` has dismiss-keyguard; an unknown level is taken as new."""
    return sdk is None or sdk >= DISMISS_KEYGUARD_MIN_SDK


def unlock_swipe(size: tuple[int, int]) -> tuple[int, int, int, int]:
    """A swipe up the middle of the screen, from 4/5 to 1/5 of its height: what dismisses a
    swipe lock screen on every release."""
    width, height = size
    return width // 2, height * 4 // 5, width // 2, height // 5


def _block(text: str, header: str) -> dict[str, str]:
    """`key=value` lines of the block that starts at a line holding `header` (indented below
    it); later blocks with the same keys do not leak in."""
    start = text.find(header)
    if start < 0:
        return {}
    lines = text[start:].splitlines()
    indent = len(lines[0]) - len(lines[0].lstrip())
    out: dict[str, str] = {}
    for line in lines[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        m = _FIELD.match(line)
        if m and m.group(1) not in out:
            out[m.group(1)] = m.group(2)
    return out


def parse_screen_state(text: str) -> ScreenState:
    """The screen state from `SCREEN_STATE_COMMAND`'s output (power and window policy dumps).

    Missing lines mean "awake, unlocked": a phone whose dumps say nothing about a lock screen
    (an Android TV, a build without keyguard) is treated as ready, as Appium does.
    """
    wake = _WAKEFULNESS.search(text)
    awake = wake is None or wake.group(1).lower() == "awake"
    delegate = _block(text, "KeyguardServiceDelegate")
    monitor = _block(text, "KeyguardStateMonitor")
    if "showingAndNotOccluded" in delegate:
        locked = delegate["showingAndNotOccluded"] == "true"
    elif "showing" in delegate:
        locked = delegate["showing"] == "true" and delegate.get("occluded") != "true"
    elif "mIsShowing" in monitor:
        locked = monitor["mIsShowing"] == "true"
    else:
        locked = bool(_OLD_LOCK.search(text))
    secure = (
        delegate.get("secure") == "true" or monitor.get("mSimSecure") == "true"
    ) and monitor.get("mTrusted") != "true"
    return ScreenState(awake=awake, locked=locked, secure=locked and secure)
