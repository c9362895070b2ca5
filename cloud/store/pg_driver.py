"""psycopg, for the checks that must recognise its errors without loading it.

A cloud on SQLite never connects with psycopg, yet importing it cost every start ~50 ms (its
C types and adapters), and every fault, e2e and node test starts clouds as processes. So only
the code that connects to PostgreSQL imports it, where it connects (SQLAlchemy's dialect, the
store's own connections, LISTEN, the replica locks). The checks that classify any error a
store raised (`errors`, `lock_waits`) ask here instead: an error of psycopg's exists only once
psycopg has been imported, so while it is not loaded none can be in hand.
"""

from __future__ import annotations

import sys
from types import ModuleType


def loaded() -> ModuleType | None:
    """psycopg when this process has imported it, else None (then no psycopg error exists)."""
    module = sys.modules.get("psycopg")
    # A module still being imported (by another thread) has no `Error` yet: none raised either.
    return module if module is not None and hasattr(module, "Error") else None
