"""What Android's shell (mksh: adbd runs a `shell:` command as `sh -c COMMAND`) prints when the
program a driver's command runs dies of a signal, checked with a real mksh (Debian's is the
same MirBSD Korn shell as Android's /system/bin/sh; `make system-deps` installs it, skipped
where none is installed). A lone command is exec'd by mksh (nothing printed), but both drivers
append an `echo` (the adb driver's end marker, uiautomator2's exit code), so a shell stays to
print "Killed " (with a trailing space) and `signal_death` sees it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from host.devices.adb_driver import _SHELL_END, monkey_launch, signal_death

MKSH = shutil.which("mksh")


@pytest.mark.skipif(MKSH is None, reason="no mksh installed")
@pytest.mark.parametrize(
    "command",
    [
        "input tap 100 200",
        "input text a && input text b",
        monkey_launch("com.example.app"),
        f"{monkey_launch('com.example.app')}; echo X4EXIT:$?",
    ],
)
@pytest.mark.parametrize("signal", [9, 6, 11])
def test_a_command_killed_by_a_signal_is_seen_as_the_drivers_send_it(
    tmp_path: Path, command: str, signal: int
) -> None:
    for name in ("input", "monkey"):
        prog = tmp_path / name
        prog.write_text(f"#!/bin/sh\nkill -{signal} $$\n")
        prog.chmod(0o755)
    done = subprocess.run(
        [str(MKSH), "-c", f"{command}; echo {_SHELL_END}"],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=30,
    )
    assert signal_death("phone-1", "tap", done.stdout) is not None, repr(done.stdout)
