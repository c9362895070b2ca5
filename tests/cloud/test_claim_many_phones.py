"""A host with as many phones as a hello may list gets work for them, on both backends.

The claim reads two queues for the host and two for each idle phone, as one compound SELECT:
at 250 idle phones it passed SQLite's limit of 500 terms in a compound SELECT ("too many terms
in compound SELECT"), every claim for the host failed, and a host of 256 phones never got a
task. The tests connect a real host stream with `validate.MAX_DEVICES` phones to a real cloud
and see each queue's task handed out.
"""

from __future__ import annotations

import grpc

from amc.v1 import types_pb2
from cloud.lease.validate import MAX_DEVICES
from cloud.server import CloudServer
from tests.cloud.cloud_harness import ScriptedHost, submit


async def test_a_host_with_the_most_phones_a_hello_allows_gets_every_queue_s_task(
    cloud: CloudServer, pki_dir: object, ops: grpc.aio.Channel
) -> None:
    """Both backends: a hello of 256 idle phones; a task for any phone, one for the host, one
    for its last phone on this host and one for its last-but-one phone on any host are each
    assigned (the phones named go to the tasks naming them)."""
    serials = [f"phone-{n:03d}" for n in range(MAX_DEVICES)]
    async with ScriptedHost(cloud.address, pki_dir, "a") as host:  # type: ignore[arg-type]
        await host.connect(serials)
        anyone = (await submit(ops)).task.task_id
        mine = (await submit(ops, target=types_pb2.TaskTarget(host_id="a"))).task.task_id
        last = serials[-1]
        on_last = (
            await submit(ops, target=types_pb2.TaskTarget(host_id="a", device_serial=last))
        ).task.task_id
        second = serials[-2]
        on_second = (
            await submit(ops, target=types_pb2.TaskTarget(device_serial=second))
        ).task.task_id
        got = {}
        for _ in range(4):
            a = (await host.next("assignment", wait=20.0)).assignment
            got[a.task_id] = a.device_serial
    assert set(got) == {anyone, mine, on_last, on_second}
    assert got[on_last] == last
    assert got[on_second] == second
    assert len(set(got.values())) == 4  # one phone each
