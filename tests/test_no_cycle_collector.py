"""`no_cycle_collector` (tests/conftest.py) turns the collector off without a full collection
first: that collection walked a worker's whole heap (1.5-1.8 CPU-s late in a run) and did
nothing for the tests, which only ask whether what they made is freed by reference counts."""

from __future__ import annotations

import gc
from typing import Any

import pytest


def test_the_collector_goes_off_without_a_collection(request: pytest.FixtureRequest) -> None:
    """The collector is off before the fixture runs, so any collection seen is the fixture's
    own (none runs by allocation then); the fixture's teardown turns it back on."""
    collections: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.disable()
    gc.callbacks.append(seen)
    try:
        request.getfixturevalue("no_cycle_collector")
        assert not gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
    assert collections == []
