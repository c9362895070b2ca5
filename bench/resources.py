"""What several benchmarks share in one run: host certificates and a private PostgreSQL server.

Both are made on first use and torn down by `close()` (the runner calls it; so does atexit).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

from cloud.pki import ensure_embedded_pki

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = "bench"

_stack = contextlib.ExitStack()
_pki_dir: Path | None = None
_pg: object | None = None


def pki(host_ids: list[str]) -> Path:
    """A PKI directory (CA, server, operator `bench`) holding certificates for `host_ids`."""
    global _pki_dir
    if _pki_dir is None:
        base = Path(tempfile.mkdtemp(prefix="amc-bench-pki-"))
        _stack.callback(shutil.rmtree, base, ignore_errors=True)
        _pki_dir = base
    return ensure_embedded_pki(_pki_dir, host_ids, operator=OPERATOR)


def postgres_url() -> str:
    """A new empty database on the run's private PostgreSQL server (started on first use)."""
    global _pg
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer, private_postgres

    if _pg is None:
        _pg = _stack.enter_context(private_postgres())
    assert isinstance(_pg, PostgresServer)
    return _pg.create_database("amc_bench")


def close() -> None:
    """Stop PostgreSQL and delete the certificates."""
    global _pki_dir, _pg
    _stack.close()
    _pki_dir = None
    _pg = None


atexit.register(close)
