"""Fixtures: virtual phones served by a real virtual adb server on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import adbutils
import pytest

from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone


@pytest.fixture
def phones() -> list[VirtualPhone]:
    return [
        VirtualPhone("virt-1"),
        VirtualPhone("virt-2", width=720, height=1600, model="amc tiny"),
    ]


@pytest.fixture
def adb_server(phones: list[VirtualPhone]) -> Iterator[ThreadedAdbServer]:
    server = ThreadedAdbServer(phones)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(adb_server: ThreadedAdbServer) -> adbutils.AdbClient:
    # A socket timeout so a protocol bug fails the test instead of hanging it.
    return adbutils.AdbClient(host="127.0.0.1", port=adb_server.port, socket_timeout=20)


@pytest.fixture
def device(client: adbutils.AdbClient) -> adbutils.AdbDevice:
    return client.device("virt-1")


@pytest.fixture
def phone(phones: list[VirtualPhone]) -> VirtualPhone:
    return phones[0]
