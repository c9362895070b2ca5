"""What the Node example host does with a `Rejected` of the cloud: it names a task, not an
attempt (lease_service.proto), so every result of that task the host holds is dropped, as the
Python host drops them (host/lease_client.py, `_handle`).

Real parts: the in-test LeaseService of tests/host/lease_fake.py (real mTLS, a real stream,
scripted to send the Rejected), results a previous process kept on disk, and host.js as its
own process.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from amc.v1 import lease_service_pb2
from tests.node.rig import fake_cloud_and_phones, running_host
from tests.node.test_node_host import HOST_ID, node

__all__ = ["node"]


async def test_a_rejected_task_loses_every_result_the_host_holds_for_it(
    node: str, tmp_path: Path
) -> None:
    """Two results of task t1 (attempts 1 and 2) kept by a previous process, and one of t2.
    Before, the Node host matched the Rejected to the first result of t1 only: the other was
    sent again every 5 s, refused every time, and kept on disk for every later start."""
    data = tmp_path / "host-data"
    kept = data / "node-host" / HOST_ID / "results"
    kept.mkdir(parents=True)
    for task_id, attempt in (("t1", 1), ("t1", 2), ("t2", 1)):
        lease_id = f"lease-{task_id}-{attempt}"
        result = {
            "task_id": task_id,
            "attempt": attempt,
            "lease_id": lease_id,
            "status": "TASK_STATUS_SUCCEEDED",
            "summary": "done",
        }
        (kept / f"{lease_id}.json").write_text(
            json.dumps({"held": None, "message": {"result": result}})
        )
    async with (
        fake_cloud_and_phones(tmp_path, HOST_ID) as rig,
        running_host(node, rig, HOST_ID, data) as run,
    ):
        cloud = rig.cloud
        await cloud.wait_for(lambda: len(cloud.results) >= 3, 60)
        await cloud.send(
            lease_service_pb2.LeaseResponse(
                rejected=lease_service_pb2.Rejected(
                    code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                    message="summary: not valid UTF-8",
                    task_id="t1",
                )
            )
        )
        await cloud.wait_for(lambda: not any(kept.glob("lease-t1-*")), 30)
        left = sorted(p.name for p in kept.glob("*.json"))
    said = run.said
    assert left == ["lease-t2-1.json"], said  # another task's result is kept
    assert said.count("dropped: the cloud rejected it (code 3)") == 2, said
