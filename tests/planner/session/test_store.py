"""The SQLite session store: append-only per (task, attempt), exact JSON, safe under concurrency."""

from __future__ import annotations

import asyncio
from pathlib import Path

from planner.conversation.items import (
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)
from planner.session.store import SessionStore, SqliteSessionStore


async def test_items_come_back_in_order_and_identical(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.sqlite")
    assert isinstance(store, SessionStore)
    items: list[SessionItem] = [
        UserObservation("scene"),
        Reasoning("anthropic", "m", text="t", signature="SIG+/=\n"),
        ToolCall("anthropic", "m", "toolu_1", "tap", {"element_id": "e1"}),
    ]
    await store.append("t1", 1, items[:2])
    await store.append("t1", 1, items[2:])
    await store.append("t1", 1, [])
    reopened = SqliteSessionStore(tmp_path / "s.sqlite")
    assert await reopened.load("t1", 1) == items
    assert await reopened.load("t1", 2) == []
    assert await reopened.load("other", 1) == []


async def test_attempts_and_retention(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.sqlite")
    assert await store.latest_attempt("t1", before=1) is None
    await store.append("t1", 1, [UserObservation("a")])
    await store.append("t1", 3, [UserObservation("c")])
    assert await store.latest_attempt("t1", before=5) == 3
    assert await store.latest_attempt("t1", before=3) == 1
    assert await store.delete("t1") == 2
    assert await store.load("t1", 1) == []


async def test_concurrent_appends_never_collide(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.sqlite")
    await asyncio.gather(*(store.append("t1", 1, [ToolResult(f"c{n}", str(n))]) for n in range(20)))
    loaded = await store.load("t1", 1)
    assert sorted(i.call_id for i in loaded if isinstance(i, ToolResult)) == sorted(
        f"c{n}" for n in range(20)
    )
