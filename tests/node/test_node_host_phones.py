"""The Node example host on phones as they are found on a desk: asleep, locked, plugged in and
out while it runs.

Real parts: `amc cloud serve` (SQLite, mTLS, offline planner) as its own process, virtual phones
served over the adb protocol, and host.js as its own process. Each behaviour is compared with
the Python host's (host/perception/perceive.py `ready_screen`, host/devices/registry.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amc.v1 import types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.test_node_host import _one_task, node

__all__ = ["node"]


@pytest.mark.parametrize(
    ("lock", "sdk", "menu_unlocks"),
    [("none", 34, True), ("swipe", 34, True), ("swipe", 25, False)],
    ids=["asleep", "swipe-locked", "swipe-locked-before-android-8"],
)
async def test_the_node_host_wakes_a_sleeping_phone_and_dismisses_a_swipe_lock(
    node: str, tmp_path: Path, lock: str, sdk: int, menu_unlocks: bool
) -> None:
    """host.js never woke a phone: on one whose screen was off (or swipe-locked) every tap
    fell on a dark screen and the task failed. As the Python host does before each look, it
    now wakes it (KEYCODE_WAKEUP) and dismisses a lock screen that needs no credential
    (`wm dismiss-keyguard`; before Android 8, which has no such command, MENU and then a swipe
    up while the lock screen is still there)."""
    phone = VirtualPhone("emulator-5554")
    phone.sdk = sdk
    phone.menu_unlocks = menu_unlocks
    if lock == "swipe":
        phone.set_screen_lock("swipe")
    phone.sleep()
    said, final, _ = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert (phone.awake, phone.locked) == (True, False), said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert phone.state.flag("dark_theme")


async def test_the_node_host_never_guesses_a_pin_and_says_so(node: str, tmp_path: Path) -> None:
    """A lock screen that needs a PIN is a person's to open: the Python host wakes the phone,
    types nothing, and fails the attempt saying to unlock it by hand. host.js carried on
    against the lock screen (its taps going to the PIN pad) until its step limit."""
    phone = VirtualPhone("emulator-5554")
    phone.set_screen_lock("pin", "2580")
    phone.sleep()
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert final.status == types_pb2.TASK_STATUS_FAILED, said
    assert "needs a PIN, pattern or password" in final.attempts[0].failure_reason, said
    assert "unlock the phone by hand" in final.attempts[0].failure_reason
    assert not decisions  # nothing was planned, nothing tapped or typed on the lock screen
    assert phone.awake and phone.locked and not phone.state.flag("dark_theme")
