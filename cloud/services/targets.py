"""A submission's target checked against the fleet: malformed is refused, unknown is warned.

A task pinned to a host that never connected, or to a phone nobody announced, would sit queued
until its deadline without a word. A malformed id can never match (host ids are certificate
identities, serials printable ASCII), so it is refused; a well-formed one the cloud does not
know yet is accepted with a warning, since the host may connect later. Every client gets the
same answer because the check lives here, in TaskService.
"""

from __future__ import annotations

import re

from cloud.pki import validate_name
from cloud.store import hosts
from cloud.store.database import Store
from cloud.store.models import HostRow

#: adb serials: USB serial numbers, `host:port`, mDNS names; never spaces or control characters.
_SERIAL_RE = re.compile(r"^[\x21-\x7e]{1,128}$")

HOST_FORMAT = (
    "a certificate identity: a letter or digit, then letters, digits, '.', '_' or '-', "
    "at most 128 characters"
)
SERIAL_FORMAT = "printable ASCII without spaces, at most 128 characters"


def malformed(host_id: str, device_serial: str) -> str | None:
    """Why the target can never match a host or phone (naming the field), or None."""
    if host_id:
        try:
            validate_name(host_id, "host id")
        except ValueError:
            return f"target.host_id: {host_id!r} is not a host id ({HOST_FORMAT})"
    if device_serial and not _SERIAL_RE.match(device_serial):
        return f"target.device_serial: {device_serial!r} is not a phone serial ({SERIAL_FORMAT})"
    return None


def _serials(row: HostRow) -> list[str]:
    return [str(d.get("serial", "")) for d in row.devices or []]


async def warnings(
    store: Store, heartbeat_seconds: float, host_id: str, device_serial: str
) -> list[str]:
    """Why a well-formed target may keep the task waiting, one sentence each (none: known)."""
    out: list[str] = []
    if host_id:
        found = await hosts.list_hosts(store, heartbeat_seconds, [host_id])
        if not found:
            out.append(
                f"host {host_id} has never connected to this cloud: the task waits until it "
                "does, or until its deadline passes"
            )
            return out
        row, connected = found[0]
        if not connected:
            out.append(
                f"host {host_id} is not connected now: the task waits until it reconnects, or "
                "until its deadline passes"
            )
        if device_serial and device_serial not in _serials(row):
            announced = ", ".join(_serials(row)) or "none"
            out.append(
                f"host {host_id} has not announced a phone {device_serial} (its phones: "
                f"{announced}): the task waits until it does"
            )
        return out
    if device_serial:
        owners = [
            row.host_id
            for row, _ in await hosts.list_hosts(store, heartbeat_seconds, mentioning=device_serial)
            if device_serial in _serials(row)
        ]
        if not owners:
            out.append(
                f"no host has announced a phone {device_serial}: the task waits until one "
                "does, or until its deadline passes"
            )
    return out
