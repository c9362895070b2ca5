"""The limits the cloud enforces on a hello (and its NUL rule on Decide and ShipDecisions) are
written in the .proto comments a host's author reads (proto/amc/v1): `Device.serial`'s 128
characters were not, and hosts sent longer ids, so the cloud refused their whole hello (every
phone of the host idle)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloud.lease.validate import MAX_DEVICES, MAX_HELD, MAX_ID

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto" / "amc" / "v1"


def _comment(file: str, message: str, field: str) -> str:
    """The comment right above `field` in `message` of `file`, joined into one line."""
    body = re.search(
        rf"^message {message} \{{\n(.*?)^\}}", (PROTO_DIR / file).read_text(), re.M | re.S
    )
    assert body is not None, message
    lines = body.group(1).splitlines()
    at = next(i for i, line in enumerate(lines) if re.match(rf"\s+[\w. ]+ {field} = \d+;", line))
    above: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("//"):
            break
        above.insert(0, line.strip().removeprefix("//").strip())
    return " ".join(above)


@pytest.mark.parametrize(
    ("file", "message", "field", "limit"),
    [
        ("types.proto", "Device", "serial", f"at most {MAX_ID} characters"),
        ("lease_service.proto", "HostHello", "devices", f"at most {MAX_DEVICES}"),
        ("lease_service.proto", "DeviceUpdate", "devices", f"at most {MAX_DEVICES}"),
        ("lease_service.proto", "HostHello", "held_assignments", f"at most {MAX_HELD:,}"),
        ("lease_service.proto", "HostHello", "process_id", f"at most {MAX_ID}"),
        ("lease_service.proto", "HeldAssignment", "task_id", f"at most {MAX_ID} characters"),
        ("lease_service.proto", "HeldAssignment", "lease_id", f"at most {MAX_ID} characters"),
    ],
)
def test_each_limit_the_cloud_enforces_on_a_hello_is_in_its_fields_comment(
    file: str, message: str, field: str, limit: str
) -> None:
    assert limit in _comment(file, message, field).lower()


def _rpc_comment(file: str, rpc: str) -> str:
    """The comment right above `rpc` in `file`, joined into one line."""
    lines = (PROTO_DIR / file).read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"rpc {rpc}("))
    above: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("//"):
            break
        above.insert(0, line.strip().removeprefix("//").strip())
    return " ".join(above)


@pytest.mark.parametrize(
    ("file", "rpc"),
    [("planner_service.proto", "Decide"), ("decision_log_service.proto", "ShipDecisions")],
)
def test_the_rpcs_a_host_sends_text_in_say_that_a_nul_is_refused(file: str, rpc: str) -> None:
    """Every text field but the reports that say they mend it refuses a NUL (`cloud.wire`):
    a host passing a phone's shell output on in `previous_outcome.driver_output` had its step
    refused INVALID_ARGUMENT, and the comments a host's author reads did not say so."""
    assert "NUL characters are not allowed" in _rpc_comment(file, rpc)
