"""Fixtures for the host console tests: a timeline filled by the real agent loop.

The store is filled the way a host fills it: the real `AgentLoop` drives a virtual phone with
the real perception (OCR included) and a scripted planner that builds the real prompts, so
every record, screenshot and OCR list the pages show is what a running host would have
written. One older-format record is imported through the store's own API.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from host.perception.ocr import OcrPool
from host.timeline.store import TimelineStore
from tests.host.console.host_console_support import Filled, StoreOnly, fill_timeline


@pytest.fixture(scope="session")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    """One store for the whole session (the loop runs once); tests only read it."""
    data = tmp_path_factory.mktemp("host-console")
    store = TimelineStore(data / "task_progress.sqlite3", data / "artifacts")
    pool = OcrPool()
    try:
        fill_timeline(store, pool)
    finally:
        pool.close()
    try:
        yield Filled(store=store, state=StoreOnly(store))
    finally:
        store.close()
