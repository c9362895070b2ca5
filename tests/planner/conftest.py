"""Fixtures for the planner tests: the fake provider server and settings pointing at it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# `tests/support` is shared by every test folder; make `tests.support` importable from here.
_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.support.fakes import ANTHROPIC_KEY, OPENAI_KEY, FakeModelServer  # noqa: E402


@pytest.fixture
def fake_server() -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY, openai_key=OPENAI_KEY) as server:
        yield server


@pytest.fixture(autouse=True)
def _clean_planner_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planner settings read the environment; keep a developer's real keys out of the tests."""
    for name in (
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "AI_PLANNER_THINKING_BUDGET_TOKENS",
        "AMC_PLANNER_PROVIDER",
        "AMC_PLANNER_MODEL",
        "AMC_PLANNER_THINKING",
        "AMC_PLANNER_EFFORT",
        "AMC_PLANNER_THINKING_BUDGET_TOKENS",
        "AMC_PLANNER_ANTHROPIC_API_KEY",
        "AMC_PLANNER_OPENAI_API_KEY",
        "AMC_PLANNER_ANTHROPIC_BASE_URL",
        "AMC_PLANNER_OPENAI_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
