"""Fixtures of the fault suite: one fleet PKI for the session, a working folder per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.processes import make_pki

HOST_IDS = ["a", "b", "c", "d"]


@pytest.fixture(scope="session")
def fault_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("fault-pki"), HOST_IDS)
