"""Google's own `adb` client (bundled with adbutils) against the virtual adb server."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from adbutils import adb_path

from host.devices.virtual.adb_server import ThreadedAdbServer

Adb = Callable[..., subprocess.CompletedProcess[bytes]]


@pytest.fixture
def adb(adb_server: ThreadedAdbServer) -> Adb:
    try:
        binary = adb_path()
    except Exception:  # adbutils raises its own error type when no adb binary is available
        pytest.skip("no adb binary")
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(adb_server.port))

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [binary, *args], env=env, capture_output=True, timeout=30, check=False
        )

    return run


def test_adb_binary_devices_shell_pull_push(adb: Adb, tmp_path: Path) -> None:
    run = adb
    devices = run("devices", "-l")
    assert b"virt-1" in devices.stdout
    assert b"model:amc_tiny" in devices.stdout
    shell = run("-s", "virt-1", "shell", "echo hi; exit 3")
    assert (shell.returncode, shell.stdout) == (3, b"hi\n")
    png = run("-s", "virt-2", "exec-out", "screencap -p")
    assert png.stdout.startswith(b"\x89PNG")
    assert run("-s", "virt-1", "shell", "uiautomator dump").returncode == 0
    local = tmp_path / "dump.xml"
    assert run("-s", "virt-1", "pull", "/sdcard/window_dump.xml", str(local)).returncode == 0
    assert local.read_text().startswith("<?xml")
    assert run("-s", "virt-1", "push", str(local), "/sdcard/copy.xml").returncode == 0
    assert run("-s", "virt-1", "shell", "cat /sdcard/copy.xml").stdout == local.read_bytes()
