"""`amc cloud serve` whose SQLite file is in a folder it cannot write.

A real `amc cloud serve` process with AMC_CLOUD_DATABASE_URL in a read-only tmpfs (mounting
needs root; skipped elsewhere). Proves: it exits 2 with one line that says the file cannot be
opened and that its folder may not be writable. Before, the hint was "check that it is reachable
and the credentials are right", which fits a database server, not a file on a read-only disk.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import cloud_process, free_port
from tests.support.tmpfs import tmpfs


def test_a_database_folder_the_cloud_cannot_write_is_named(tmp_path: Path, fault_pki: Path) -> None:
    with tmpfs(tmp_path / "ro", "size=1m,ro") as folder:
        url = f"sqlite+aiosqlite:///{folder / 'cloud.sqlite3'}"
        cloud = cloud_process(
            tmp_path, "cloud", database_url=url, pki_dir=fault_pki, port=free_port()
        ).start()
        try:
            assert cloud.proc is not None
            code = cloud.proc.wait(60)
        finally:
            cloud.stop()
    said = cloud.output()
    assert code == 2, said
    assert f"AMC_CLOUD_DATABASE_URL: cannot open the database {url}" in said, said
    assert "its folder gone or not writable?" in said, said
    assert "credentials" not in said, said
