"""A stream's result lane stays small, whatever the host sends.

The lane (`cloud/lease/result_lane.py`) records a stream's results off its reader. Unbounded, a
host that sent results and never read their answers filled the replica's memory (the reader
only queued, so gRPC's flow control never slowed the host); and while an operator's psql
session held the rows of some results, the host's own resends (1 s after each UNAVAILABLE,
each unanswered result every 5 s) added a copy each, a result whose rows were free waiting
behind all of them. Real Lease streams; the rows held from a connection of their own.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

import cloud.lease.stream as stream_mod
from amc.v1 import types_pb2
from cloud.lease import result_lane
from cloud.lease.result_lane import ResultLane
from cloud.server import CloudServer
from cloud.store.database import libpq_dsn
from tests.cloud.cloud_harness import ScriptedHost, result, submit

HOLD_TASK = "SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE"
HOLD_ATTEMPT = "SELECT 1 FROM attempts WHERE task_id = %s FOR UPDATE"


def _lanes(monkeypatch: pytest.MonkeyPatch) -> list[ResultLane]:
    """The lanes the streams open from here on."""
    made: list[ResultLane] = []

    class Seen(ResultLane):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(stream_mod, "ResultLane", Seen)
    return made


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_host_sending_more_results_than_are_answered_is_slowed_not_queued_for(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1 sends 150 results (none a copy of another) while each waits its bounded while for
    an attempt row a psql session holds: the lane answers one each 250 ms. The reader stops
    reading at a full lane (the rest wait in the transport, where gRPC's flow control slows
    the host) instead of the lane taking in all the host sent."""
    lanes = _lanes(monkeypatch)
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    try:
        async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
            await host.connect(["p1"], process_id="p")
            await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
            a = (await host.next("assignment")).assignment
            await holder.execute(HOLD_ATTEMPT, (a.task_id,))
            msg = result(a)
            for n in range(150):
                msg.result.lease_id = f"{a.lease_id}-{n}"
                await host.send(msg)
            first = await host.next("rejected", wait=20)
            assert first.rejected.code == grpc.StatusCode.UNAVAILABLE.value[0], first
            await asyncio.sleep(0.5)  # what the reader took in is queued
            queued = lanes[0]._queue.qsize()
            assert queued < 100, f"{queued} of 150 results queued in memory"
            assert queued <= result_lane.LANE_LIMIT, queued
    finally:
        await holder.rollback()
        await holder.close()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_copies_of_a_result_waiting_for_its_held_rows_wait_as_one(
    cloud: CloudServer,
    ops: Any,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Four results whose task rows a psql session holds, each sent six times (the host's
    resends while the rows stay held): the lane keeps one waiting copy of each, the held
    warning is logged once per result, and once the rows are free each result is answered
    (one answer for the copies that joined) and recorded once."""
    caplog.set_level(logging.DEBUG, logger="cloud.lease.stream")
    lanes = _lanes(monkeypatch)
    k, copies = 4, 6
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    try:
        async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
            await host.connect([f"p{i}" for i in range(k)], process_id="p")
            for _ in range(k):
                await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
            got = [(await host.next("assignment", wait=20)).assignment for _ in range(k)]
            for a in got:
                await holder.execute(HOLD_TASK, (a.task_id,))
            for _ in range(copies):
                for a in got:
                    await host.send(result(a))
            first = await host.next("rejected", wait=20)  # the first copy's bounded wait
            assert first.rejected.code == grpc.StatusCode.UNAVAILABLE.value[0], first
            sizes = [lanes[0]._queue.qsize()]
            assert max(sizes) <= k, sizes  # one waiting copy per result, not one per send
            # Answer by answer, until all are told UNAVAILABLE at least once.
            told: set[str] = {first.rejected.task_id}
            while len(told) < k:
                m = await host.next("rejected", wait=20)
                told.add(m.rejected.task_id)
            warned = [
                r for r in caplog.records if r.levelno == logging.WARNING and "waits:" in r.message
            ]
            assert len(warned) == k, [r.message for r in warned]
            await holder.rollback()
            for a in got:  # the host's resend
                await host.send(result(a))
            acked: set[str] = set()
            while len(acked) < k:
                m = await host.next(wait=20)
                if m.HasField("result_ack"):
                    assert m.result_ack.task_id not in acked or m.result_ack.duplicate, m
                    acked.add(m.result_ack.task_id)
            assert len(lanes[0]._queue._queue) <= k  # type: ignore[attr-defined]
    finally:
        await holder.rollback()
        await holder.close()
