"""The cloud's artifact folder (`AMC_CLOUD_ARTIFACT_DIR`) is the cloud account's alone.

Proves: the folder the directory store makes for the step screenshots is owner-only (0700);
one that exists keeps the mode it was given.
"""

from __future__ import annotations

import stat
from pathlib import Path

from cloud.artifacts.directory import DirectoryStore

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


async def test_the_folder_made_for_screenshots_is_owner_only(tmp_path: Path) -> None:
    root = tmp_path / "cloud" / "artifacts"
    store = DirectoryStore(root)
    await store.put("t1/1/00001-before.png", PNG, "image/png")
    assert await store.get("t1/1/00001-before.png") == PNG
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


async def test_an_artifact_folder_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    root.chmod(0o750)
    await DirectoryStore(root).put("t1/1/00001-after.png", PNG, "image/png")
    assert stat.S_IMODE(root.stat().st_mode) == 0o750
