"""What the host keeps (timeline, screenshots, outbox, sessions) is its account's alone.

Proves: the folders a host makes for its data are owner-only (0700), so another account on
the machine cannot read the phones' screenshots, the prompts or the model's thinking that
the host console shows only after a login; a folder that was already there keeps the mode
it was given (an operator's choice is not undone at each start).
"""

from __future__ import annotations

import stat
from pathlib import Path

from host.settings import HostSettings
from host.start_disk import open_data


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_folders_a_host_makes_for_its_data_are_owner_only(tmp_path: Path) -> None:
    settings = HostSettings(data_dir=tmp_path / "fresh" / "amc_host_data")
    opened = open_data(settings, sessions=True)
    try:
        opened.store.start_task("t1", 1, "goal", "emulator-5554")
        shot = opened.store.artifacts.write("t1", 1, "step001-before.png", b"\x89PNG")
        kept = [
            settings.resolved_db_path.parent,
            settings.resolved_artifact_dir,
            settings.resolved_outbox_path.parent,
        ]
        assert settings.data_dir in kept
        for folder in kept:
            assert _mode(folder) == 0o700, folder
        # The files inside are then out of other accounts' reach whatever their own mode.
        assert (settings.resolved_artifact_dir / shot).is_file()
    finally:
        opened.store.close()
        opened.outbox.close()


def test_a_data_folder_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    data = tmp_path / "amc_host_data"
    data.mkdir(mode=0o750)
    data.chmod(0o750)  # whatever the umask made of it
    settings = HostSettings(data_dir=data)
    opened = open_data(settings)
    try:
        assert _mode(data) == 0o750
        assert _mode(settings.resolved_artifact_dir) == 0o700  # made here
    finally:
        opened.store.close()
        opened.outbox.close()
