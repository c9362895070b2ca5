"""`amc host run` with a data folder it cannot write.

Real `amc host run` processes whose AMC_HOST_DATA_DIR is an existing file, or a folder on a
read-only filesystem (a tmpfs mounted read-only: root only, skipped elsewhere). Proves: the
host exits 2 (a setting to fix) with one line naming the folder, the reason and the setting.
Before, it exited 70, the code of a bug, with "unexpected OSError: [Errno 30] …".
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import host_process
from tests.support.tmpfs import fill, tmpfs


@pytest.mark.parametrize("kind", ["a file", "read-only"])
def test_a_data_folder_the_host_cannot_write_is_a_setting_to_fix(
    tmp_path: Path, fault_pki: Path, kind: str
) -> None:
    with contextlib.ExitStack() as stack:
        if kind == "a file":
            data = tmp_path / "data"
            data.write_text("not a folder")
            reason = "File exists"
        else:
            data = stack.enter_context(tmpfs(tmp_path / "ro", "size=1m,ro"))
            reason = "Read-only file system"
        host = host_process(
            tmp_path,
            "a",
            cloud_address="127.0.0.1:1",  # never reached: the host stops before it dials
            pki_dir=fault_pki,
            extra={"AMC_HOST_DATA_DIR": str(data)},
        ).start()
        try:
            assert host.proc is not None
            code = host.proc.wait(60)
        finally:
            host.stop()
    said = host.output()
    assert code == 2, said
    assert "amc host run: cannot write the host's data folder: " in said, said
    assert reason in said and str(data) in said and "AMC_HOST_DATA_DIR" in said, said
    assert "unexpected" not in said, said


@pytest.mark.parametrize("kind", ["full", "read-only"])
def test_a_data_folder_whose_databases_cannot_be_written_is_a_setting_to_fix(
    tmp_path: Path, fault_pki: Path, kind: str
) -> None:
    """A folder that already holds the host's databases passes every folder check, and fails
    first in SQLite (`sqlite3.OperationalError`, creating its tables): that exited 70,
    "unexpected OperationalError", not 2 with the folder and the setting named."""
    with tmpfs(tmp_path / "data", "size=1m") as data:
        for name in ("task_progress.sqlite3", "outbox.sqlite3"):
            (data / name).touch()  # an empty file is an empty SQLite database
        (data / "artifacts").mkdir()
        if kind == "full":
            fill(data)
            reason = "database or disk is full"
        else:
            remount = ["mount", "-o", "remount,ro", str(data)]
            subprocess.run(remount, check=True, capture_output=True)
            reason = "readonly database"
        host = host_process(
            tmp_path,
            "a",
            cloud_address="127.0.0.1:1",  # never reached: the host stops before it dials
            pki_dir=fault_pki,
            extra={"AMC_HOST_DATA_DIR": str(data)},
        ).start()
        try:
            assert host.proc is not None
            code = host.proc.wait(60)
        finally:
            host.stop()
    said = host.output()
    assert code == 2, said
    assert "amc host run: cannot write the host's data folder: " in said, said
    assert reason in said and str(data) in said and "AMC_HOST_DATA_DIR" in said, said
    assert "unexpected" not in said, said
