"""The operator side of a benchmark: an mTLS operator channel to a cloud under test."""

from __future__ import annotations

import asyncio
from pathlib import Path

from google.protobuf import duration_pb2

from amc.v1 import task_service_pb2, types_pb2
from bench.resources import OPERATOR
from console.client import OperatorClient, secure_channel


def operator(address: str, pki_dir: Path) -> OperatorClient:
    """An operator client with the run's `bench` operator certificate."""
    return OperatorClient.over(
        secure_channel(
            address,
            ca=pki_dir / "ca.pem",
            cert=pki_dir / f"operator-{OPERATOR}.pem",
            key=pki_dir / f"operator-{OPERATOR}.key",
            server_name="localhost",
        )
    )


async def submit_many(
    address: str,
    pki_dir: Path,
    count: int,
    lease_seconds: int = 3600,
    concurrency: int = 64,
    target_host: str = "",
) -> list[str]:
    """Submit `count` tasks with long leases (for `target_host` only, if named); their ids."""
    client = operator(address, pki_dir)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with gate:
            response = await client.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal=f"bench task {i}",
                    lease_duration=duration_pb2.Duration(seconds=lease_seconds),
                    target=types_pb2.TaskTarget(host_id=target_host),
                )
            )
            return str(response.task.task_id)

    try:
        return list(await asyncio.gather(*(one(i) for i in range(count))))
    finally:
        await client.close()
