"""Dispatch latency: SubmitTask → Assignment received on an idle host, with 100 hosts connected.

The cloud runs in its own process (SQLite, then PostgreSQL); 100 simulated hosts (own certificates,
own streams) and the operator run in this process, so both ends of each sample use one clock.
Tasks are submitted one at a time; the host that gets one answers with a result at once, so the
fleet stays idle. Baseline in the same run: the SubmitTask round trip itself (the unary RPC that
writes the task), i.e. how much later than its own acknowledgement the push reaches the host.

    python -m bench.dispatch_latency [--smoke]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import task_service_pb2, types_pb2
from bench import command, resources
from bench.cloud_client import operator
from bench.report import Section, percentile
from bench.servers import async_server_process
from bench.sim_hosts import GrpcHost, host_ids


class _Arrivals:
    """When each task's assignment reached a host."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.changed = asyncio.Condition()

    async def wait(self, task_id: str) -> float:
        async with self.changed:
            await self.changed.wait_for(lambda: task_id in self.at)
        return self.at[task_id]


async def _serve_host(host: GrpcHost, arrivals: _Arrivals) -> None:
    """Record each assignment's arrival, then finish the task at once."""
    while True:
        msg = await host.call.read()
        if msg is grpc.aio.EOF:
            return
        if msg.WhichOneof("kind") != "assignment":
            continue
        now = time.perf_counter()
        a = msg.assignment
        async with arrivals.changed:
            arrivals.at[a.task_id] = now
            arrivals.changed.notify_all()
        await host.call.write(
            lease_pb.LeaseRequest(
                result=lease_pb.TaskResult(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    status=types_pb2.TASK_STATUS_SUCCEEDED,
                    summary="done",
                )
            )
        )


async def measure(
    url: str, pki_dir: Path, ids: list[str], samples: int
) -> tuple[list[float], list[float]]:
    """(dispatch latencies, SubmitTask round trips) in seconds."""
    async with async_server_process("cloud", "--db", url, "--pki", str(pki_dir)) as server:
        hosts = [GrpcHost(h, server.address, pki_dir) for h in ids]
        await asyncio.gather(*(h.connect() for h in hosts))
        arrivals = _Arrivals()
        readers = [asyncio.create_task(_serve_host(h, arrivals)) for h in hosts]
        client = operator(server.address, pki_dir)
        dispatch: list[float] = []
        rtt: list[float] = []
        try:
            # Warm-up: connections, statement caches.
            for i in range(-3, samples):
                t0 = time.perf_counter()
                r = await client.tasks.SubmitTask(
                    task_service_pb2.SubmitTaskRequest(goal=f"dispatch sample {i}")
                )
                t1 = time.perf_counter()
                arrived = await asyncio.wait_for(arrivals.wait(r.task.task_id), 30)
                if i >= 0:
                    rtt.append(t1 - t0)
                    dispatch.append(arrived - t0)
                await asyncio.sleep(0.01)
        finally:
            for t in readers:
                t.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await asyncio.gather(*(h.close() for h in hosts), return_exceptions=True)
            await client.close()
    return dispatch, rtt


def run(smoke: bool) -> Section:
    n_hosts, samples = (20, 15) if smoke else (100, 300)
    t0 = time.monotonic()
    section = Section(
        "dispatch_latency",
        "Dispatch latency",
        f"{n_hosts} connected idle hosts, {samples} tasks submitted one at a time",
    )
    ids = host_ids(n_hosts, "disp")
    pki_dir = resources.pki(ids)
    with tempfile.TemporaryDirectory(prefix="amc-bench-dispatch-") as tmp:
        for label, url in (
            ("SQLite", f"sqlite+aiosqlite:///{Path(tmp) / 'cloud.sqlite3'}"),
            ("PostgreSQL", resources.postgres_url()),
        ):
            dispatch, rtt = asyncio.run(measure(url, pki_dir, ids, samples))
            d_ms = [x * 1000 for x in dispatch]
            r_ms = [x * 1000 for x in rtt]
            for q in (50, 99):
                value, base = percentile(d_ms, q), percentile(r_ms, q)
                section.add(
                    f"{label} submit → assignment p{q}",
                    round(value, 2),
                    "ms",
                    baseline=round(base, 2),
                    baseline_name=f"SubmitTask round trip p{q}",
                    note=f"push lands {value - base:+.2f} ms after the submit's own answer",
                )
    section.notes.append(
        "Dispatch is pushed on the host's open stream: a queued task wakes the dispatcher, which "
        "claims it for an idle phone and writes the Assignment; there is no polling interval."
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke))


if __name__ == "__main__":
    raise SystemExit(main())
