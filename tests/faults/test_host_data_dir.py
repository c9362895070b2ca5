"""`amc host run` with a data folder it cannot write.

Real `amc host run` processes whose AMC_HOST_DATA_DIR is an existing file, or a folder on a
read-only filesystem (a tmpfs mounted read-only: root only, skipped elsewhere). Proves: the
host exits 2 (a setting to fix) with one line naming the folder, the reason and the setting.
Before, it exited 70, the code of a bug, with "unexpected OSError: [Errno 30] …".
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import host_process


def _read_only_folder(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "ro"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)], check=True)
    return folder


@pytest.mark.parametrize("kind", ["a file", "read-only"])
def test_a_data_folder_the_host_cannot_write_is_a_setting_to_fix(
    tmp_path: Path, fault_pki: Path, kind: str
) -> None:
    if kind == "a file":
        data = tmp_path / "data"
        data.write_text("not a folder")
        reason = "File exists"
    else:
        data = _read_only_folder(tmp_path)
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
        if kind == "read-only":
            subprocess.run(["umount", "-l", str(data)], check=False)
    said = host.output()
    assert code == 2, said
    assert "amc host run: cannot write the host's data folder: " in said, said
    assert reason in said and str(data) in said and "AMC_HOST_DATA_DIR" in said, said
    assert "unexpected" not in said, said
