"""A Python host built from proto/ alone: the modules it imports were compiled from the .proto
files by the test into a folder of their own; nothing of amc's own code is imported.

It opens the Lease stream with its host certificate, says hello with one phone, takes the
assignment, parses a uiautomator dump itself into a typed ScreenObservation, asks Decide for the
first step and prints the decision as JSON.

Usage: python proto_only_client.py ADDRESS PKI_DIR HOST_ID SERIAL DUMP_XML
"""

from __future__ import annotations

import json
import queue
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import grpc
from google.protobuf import json_format

from amc.v1 import (
    lease_service_pb2,
    lease_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    types_pb2,
)

BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
FLAGS = ("clickable", "checkable", "checked", "enabled", "focused", "focusable", "scrollable")


def observation_of(dump: str, width: int, height: int) -> types_pb2.ScreenObservation:
    """Every node with text, a description or something to do, as a typed element."""
    root = ET.fromstring(dump[dump.index("<") :])
    observation = types_pb2.ScreenObservation(screen_width=width, screen_height=height)
    observation.rotation = types_pb2.Rotation.Value(f"ROTATION_{90 * int(root.get('rotation', 0))}")
    for node in root.iter("node"):
        a = node.attrib
        m = BOUNDS.fullmatch(a.get("bounds", ""))
        actionable = a.get("clickable") == "true" or a.get("checkable") == "true"
        if not m or not (a.get("text") or a.get("content-desc") or actionable):
            continue
        left, top, right, bottom = (int(v) for v in m.groups())
        element = observation.elements.add(
            element_id=f"n{len(observation.elements) + 1}",
            text=a.get("text", ""),
            content_description=a.get("content-desc", ""),
            resource_id=a.get("resource-id", ""),
            class_name=a.get("class", ""),
            package_name=a.get("package", ""),
            bounds=types_pb2.Rect(left=left, top=top, right=right, bottom=bottom),
            long_clickable=a.get("long-clickable") == "true",
        )
        for flag in FLAGS:
            setattr(element, flag, a.get(flag) == "true")
    return observation


def main(address: str, pki: Path, host_id: str, serial: str, dump_path: Path) -> None:
    credentials = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / f"host-{host_id}.key").read_bytes(),
        (pki / f"host-{host_id}.pem").read_bytes(),
    )
    channel = grpc.secure_channel(
        address, credentials, options=[("grpc.ssl_target_name_override", "localhost")]
    )
    outbox: queue.Queue[lease_service_pb2.LeaseRequest | None] = queue.Queue()
    stream = lease_service_pb2_grpc.LeaseServiceStub(channel).Lease(iter(outbox.get, None))
    device = types_pb2.Device(serial=serial, model="phone", state=types_pb2.DEVICE_STATE_ONLINE)
    outbox.put(lease_service_pb2.LeaseRequest(hello=lease_service_pb2.HostHello(devices=[device])))
    assignment = next(m.assignment for m in stream if m.WhichOneof("kind") == "assignment")
    observation = observation_of(dump_path.read_text(), 1080, 2400)
    response = planner_service_pb2_grpc.PlannerServiceStub(channel).Decide(
        planner_service_pb2.DecideRequest(
            task_id=assignment.task_id,
            attempt=assignment.attempt,
            lease_id=assignment.lease_id,
            observation=observation,
        ),
        timeout=60,
    )
    outbox.put(None)
    channel.close()
    import amc  # where the contract modules came from, and that no amc code came along

    ours = sorted({name.split(".")[0] for name in sys.modules} & {"planner", "cloud", "host"})
    decision = json_format.MessageToDict(response.decision, preserving_proto_field_name=True)
    print(json.dumps({"decision": decision, "amc_from": amc.__file__, "imported": ours}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5]))
