"""The Node.js client test runs against the same real server fixtures as the cloud tests."""

from tests.cloud.conftest import (
    cloud,
    db_url,
    make_settings,
    migrated_sqlite,
    pki_dir,
)

__all__ = ["cloud", "db_url", "make_settings", "migrated_sqlite", "pki_dir"]
