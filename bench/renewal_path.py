"""The replica's per-renewal Python, in process: what a renewal costs the loop's thread without
the network.

The lease benchmark (`bench/lease_capacity.py`) compares a renewal with the bare grpc.aio echo
stream end to end, which on a shared machine is noisy; this drives the same code the stream's
reader runs for each renewal (the wire parser, `LeaseManager.touch`, `LeaseServicer._handle`:
validation, `LeaseManager.renew`, the batcher's two stages, the store's statements, the
reply's serialisation) for N hosts' renewals on a real store, with one reader task per host
as the stream has, but no transport. Renewals arrive in waves of `--wave` hosts (a wave forms
one batch, as renewals arriving within the batch window do) and carry new progress every
`--step-every` renewals, as the simulated hosts' do. The same harness run with `--echo`
answers as the echo server does (parse, reply with the renewal's ids and the time), which is
the in-process share of the transport's work that the replica repeats.

Figures: the process's CPU time (`time.process_time`) per renewal over the measured waves;
`--profile` prints cProfile's top functions instead (which slows everything; shares only).
Comparing two builds: run this from each tree, alternated, on the same machine.

    python -m bench.renewal_path [--hosts N] [--waves N] [--wave N] [--step-every N]
                                 [--postgres] [--echo] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud import supervised, wire
from cloud.events import EventBus
from cloud.lease.manager import LeaseManager
from cloud.lease.session import HostSession
from cloud.lease.stream import LeaseServicer
from cloud.settings import CloudSettings
from cloud.store import leases, tasks
from cloud.store.database import Store
from cloud.store.engine import upgrade

PROFILE_SORT = os.environ.get("PROFILE_SORT", "tottime")
_parse = wire.parser(lease_pb.LeaseRequest.FromString)


def _renewal(claimed: leases.Claimed, step: int) -> bytes:
    """A renewal as a simulated host sends it (`bench.sim_hosts.renewal`), serialised."""
    return lease_pb.LeaseRequest(
        renewal=lease_pb.LeaseRenewal(
            task_id=claimed.task_id,
            attempt=claimed.attempt,
            lease_id=claimed.lease_id,
            progress=types_pb2.Progress(
                step_index=step,
                step_status=types_pb2.STEP_STATUS_ACTING,
                summary=f"step {step}: tapping Dark theme",
            ),
        )
    ).SerializeToString()


def _echo(msg: lease_pb.LeaseRequest) -> lease_pb.LeaseResponse:
    """What `bench.servers.EchoLease` answers a renewal."""
    r = msg.renewal
    reply = lease_pb.LeaseResponse(
        renewed=lease_pb.Renewed(task_id=r.task_id, attempt=r.attempt, lease_id=r.lease_id)
    )
    reply.renewed.lease_expires_at.GetCurrentTime()
    return reply


async def _fleet(store: Store, hosts: int, lease_seconds: float) -> list[leases.Claimed]:
    """`hosts` tasks, each claimed by a host of its own (ASSIGNED)."""
    await upgrade(store.engine)
    for _ in range(hosts):
        await tasks.submit(
            store,
            tasks.NewTask(
                goal="g", max_attempts=3, lease_seconds=lease_seconds, timeout_seconds=86400
            ),
        )
    claimed = []
    for i in range(hosts):
        got = await leases.claim(store, f"host-{i:05d}", ["phone"], 2)
        assert got is not None
        claimed.append(got)
    return claimed


async def measure(
    url: str, hosts: int, waves: int, wave: int, step_every: int, echo: bool, profile: bool
) -> float:
    """CPU seconds per renewal over `waves` waves (after one warm-up pass over every host)."""
    store = Store.from_url(url)
    settings = CloudSettings(database_url=url)
    manager = LeaseManager(store, EventBus(store), settings)
    servicer = LeaseServicer(manager)
    try:
        claimed = await _fleet(store, hosts, settings.default_lease_seconds)
        manager.clock.reset()
        manager.batcher.start()
        # As the replica does (`cloud.server`): else the WAL grows and every read slows down.
        jobs = [
            supervised.start(
                "sqlite-checkpoint", store.checkpoint, interval=settings.sqlite_checkpoint_seconds
            )
        ]
        inboxes: list[asyncio.Queue[bytes]] = [asyncio.Queue() for _ in claimed]
        answered = 0
        done = asyncio.Event()
        expected = 0

        async def reader(i: int) -> None:
            # The stream's reader (`LeaseServicer._read`) without the transport.
            nonlocal answered
            session = HostSession(f"host-{i:05d}", types_pb2.PLANNER_TRANSPORT_CLOUD)
            inbox = inboxes[i]
            while True:
                msg = _parse(await inbox.get())
                if echo:
                    reply: lease_pb.LeaseResponse | None = _echo(msg)
                else:
                    manager.touch(session)
                    reply = await servicer._handle(session, msg)
                assert reply is not None and reply.WhichOneof("kind") == "renewed", reply
                reply.SerializeToString()
                answered += 1
                if answered == expected:
                    done.set()

        readers = [asyncio.create_task(reader(i)) for i in range(len(claimed))]
        renewals = [0] * len(claimed)

        async def run(count: int) -> None:
            nonlocal expected
            for w in range(count):
                done.clear()
                expected = answered + wave
                for k in range(wave):
                    i = (w * wave + k) % len(claimed)
                    step = renewals[i] // step_every
                    renewals[i] += 1
                    inboxes[i].put_nowait(_renewal(claimed[i], step))
                await done.wait()

        await run(-(-len(claimed) // wave))  # warm-up: every lease started (written) once
        profiler = cProfile.Profile() if profile else None
        started = time.process_time()
        if profiler is not None:
            profiler.enable()
        await run(waves)
        if profiler is not None:
            profiler.disable()
        spent = time.process_time() - started
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await supervised.stop(jobs)
        if profiler is not None:
            pstats.Stats(profiler).sort_stats(PROFILE_SORT).print_stats(45)
        return spent / (waves * wave)
    finally:
        await manager.batcher.stop()
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=2_000)
    parser.add_argument("--waves", type=int, default=2_000)
    parser.add_argument("--wave", type=int, default=10)
    parser.add_argument("--step-every", type=int, default=5)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--echo", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="amc-bench-path-") as tmp:
        if args.postgres:
            from bench import resources

            url = resources.postgres_url()
        else:
            url = f"sqlite+aiosqlite:///{Path(tmp) / 'cloud.sqlite3'}"
        try:
            per = asyncio.run(
                measure(
                    url,
                    args.hosts,
                    args.waves,
                    args.wave,
                    args.step_every,
                    args.echo,
                    args.profile,
                )
            )
        finally:
            if args.postgres:
                from bench import resources

                resources.close()
    kind = "echo" if args.echo else ("postgres" if args.postgres else "sqlite")
    print(f"{kind} {per * 1e6:.1f} us/renewal")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
