"""Statements as SQLite ran them, whoever sent them (SQLAlchemy or the driver directly).

The store's hot SQLite paths run on the loop's own thread through the driver (`sqlite3`), past
SQLAlchemy's events; SQLite's trace hook sees every statement, with its parameters inlined.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import Engine


def trace(engine: Engine, sent: list[str]) -> None:
    """Append every statement `engine`'s connection runs from now on to `sent` (stripped).

    For the store's loop-thread engines, whose pool keeps one connection (`StaticPool`)."""
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        driver.set_trace_callback(lambda sql: sent.append(sql.strip()))
    finally:
        raw.close()
