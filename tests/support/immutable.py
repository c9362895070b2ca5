"""A folder that refuses new entries even to root (`chattr +i`): the data folder whose
permissions were changed under a running host, for tests that run as root, where `chmod`
refuses nothing. Writes there fail with EPERM ("Operation not permitted"), as a folder
chmod'ed read-only refuses a non-root host with EACCES. Where the file system or the
container refuses the attribute, the test is skipped, saying why."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def set_immutable(folder: Path, on: bool) -> None:
    """Set (or clear) `folder`'s immutable attribute; fails the test when that is refused."""
    flag = "+i" if on else "-i"
    subprocess.run(["chattr", flag, str(folder)], capture_output=True, text=True, check=True)


@contextlib.contextmanager
def immutable(folder: Path) -> Iterator[Path]:
    """`folder` (made if missing) refusing new entries until the block ends (or `set_immutable`
    clears it earlier)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["chattr", "+i", str(folder)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot make a folder immutable here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=False)
