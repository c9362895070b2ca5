"""The Node example host takes no work while it cannot write its data folder, as the Python
host does (host/timeline/data_folder.py, tests/faults/test_host_disk_full.py).

Real parts: `amc cloud serve` (SQLite, mTLS, the offline planner) or the in-test LeaseService
of tests/host/lease_fake.py (it sends an assignment the real cloud sends only in a race), a
virtual phone served over the adb protocol, host.js as its own process, and its data folder on
a tmpfs of the test's own (mounting needs root; skipped elsewhere): filled to the last byte
(the disk says ENOSPC) or mounted read-only (EROFS); or a folder made immutable (`chattr +i`,
EPERM), as a folder whose permissions changed refuses the host (chmod refuses nothing to root).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from pathlib import Path

from amc.v1 import fleet_service_pb2, lease_service_pb2, task_service_pb2, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import Rig, cloud_and_phone, fake_cloud_and_phones, running_host, spawn_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.immutable import immutable, set_immutable
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import until

__all__ = ["node"]

PROBE = {"AMC_HOST_DATA_DIR_PROBE_S": "0.5"}
PAUSED = f"host {HOST_ID} cannot write its data folder "


async def _phones(rig: Rig) -> dict[str, tuple[types_pb2.DeviceState.ValueType, str]]:
    """The Node host's phones as the cloud knows them now: state and reason, by id."""
    hosts = (await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
    return {d.serial: (d.state, d.reason) for h in hosts if h.host_id == HOST_ID for d in h.devices}


async def test_a_full_data_folder_stops_the_host_taking_work_until_a_write_works(
    node: str, tmp_path: Path
) -> None:
    """host.js whose data folder filled up kept taking tasks, each result sent from memory only
    (a restart lost it). Now the first write the disk refuses pauses it: one error naming the
    folder and what the disk said, its phone OFFLINE with that reason, no task taken, a probe
    write every AMC_HOST_DATA_DIR_PROBE_S; once space is freed it takes work again."""
    phone = VirtualPhone("emulator-5554")
    said: list[str] = []

    def since(start: int, words: str) -> bool:
        return any(words in line for line in said[start:])

    with tmpfs(tmp_path / "host-data", "size=1m") as data:
        async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
            host = await spawn_host(
                node, rig.address, rig.pki, HOST_ID, rig.adb_port, data, **PROBE
            )
            assert host.stderr is not None
            stderr = host.stderr

            async def read() -> None:
                while line := (await stderr.readline()).decode():
                    said.append(line)

            async def task(task_id: str) -> types_pb2.Task:
                get = task_service_pb2.GetTaskRequest(task_id=task_id)
                found: types_pb2.Task = (await rig.client.tasks.GetTask(get, timeout=10)).task
                return found

            async def submit() -> str:
                request = task_service_pb2.SubmitTaskRequest(
                    goal="Turn on dark theme", max_attempts=5
                )
                task_id: str = (await rig.client.tasks.SubmitTask(request, timeout=10)).task.task_id
                return task_id

            async def state_is(state: types_pb2.DeviceState.ValueType) -> bool:
                return (await _phones(rig)).get(phone.serial, (None, ""))[0] == state

            reader = asyncio.create_task(read())
            try:
                await until(lambda: state_is(types_pb2.DEVICE_STATE_ONLINE), 30, "online")
                filler = fill(data)
                first = await submit()

                async def done(task_id: str) -> bool:
                    return (await task(task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED

                await until(lambda: done(first), 90, "the first task, its result unkept")
                await until(lambda: state_is(types_pb2.DEVICE_STATE_OFFLINE), 30, "paused")
                paused = await _phones(rig)
                second = await submit()
                start = len(said)
                await until(lambda: since(start, "still cannot be written"), 30, "a probe")
                waiting = await task(second)
                filler.unlink()
                await until(lambda: done(second), 90, "the second task, once space is freed")
                back = await _phones(rig)
            finally:
                if host.returncode is None:
                    host.kill()
                await host.wait()
                await reader
    log = "".join(said)
    folder = str(data.resolve())
    errors = [line for line in said if "error: " + PAUSED in line]
    assert len(errors) == 1, log  # said once, not at every write or probe
    assert f"{PAUSED}{folder} (ENOSPC: no space left on device" in errors[0], log
    state, reason = paused[phone.serial]
    assert state == types_pb2.DEVICE_STATE_OFFLINE, (paused, log)
    assert reason.startswith(f"{PAUSED}{folder} (ENOSPC"), (paused, log)
    assert "free space or fix the folder (AMC_HOST_DATA_DIR)" in reason, reason
    assert waiting.status == types_pb2.TASK_STATUS_QUEUED, (waiting, log)
    assert len(waiting.attempts) == 0, (waiting, log)  # none sent to the paused host
    assert "can be written again: the host takes work again" in log, log
    assert back == {phone.serial: (types_pb2.DEVICE_STATE_ONLINE, "")}, (back, log)


async def _refused_until_writable(
    node: str,
    tmp_path: Path,
    folder: AbstractContextManager[Path],
    make_writable: Callable[[Path], Awaitable[None]],
    error: str,
) -> None:
    """host.js started on the data folder `folder` gives, which refuses its writes with
    `error`: its hello says the phone OFFLINE, saying why; an assignment the cloud sends anyway
    (a race) is refused FAILED, retryable, ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE, with the
    same words; after `make_writable` the probe says the phone ONLINE."""
    phone = VirtualPhone("emulator-5554")
    with folder as data:
        async with (
            fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig,
            running_host(node, rig, HOST_ID, data, certs=None, **PROBE) as run,
        ):
            cloud = rig.cloud
            await cloud.wait_for(lambda: cloud.hellos, 60)
            hello = list(cloud.hellos[0].devices)
            await cloud.assign("t1", phone.serial, "Turn on dark theme")
            await cloud.wait_for(lambda: cloud.results, 60)
            await make_writable(data)

            def online() -> bool:
                return [d.state for d in cloud.last_devices()] == [types_pb2.DEVICE_STATE_ONLINE]

            await cloud.wait_for(online, 30)
            back = cloud.last_devices()
    said = run.said
    words = f"{PAUSED}{data.resolve()} ({error}"
    assert [(d.serial, d.state) for d in hello] == [
        (phone.serial, types_pb2.DEVICE_STATE_OFFLINE)
    ], said
    assert hello[0].reason.startswith(words), (hello, said)
    refused = cloud.results[0]
    assert refused.refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE, said
    assert (refused.status, refused.retryable) == (types_pb2.TASK_STATUS_FAILED, True), said
    assert refused.summary == hello[0].reason, (refused, said)
    assert [(d.state, d.reason) for d in back] == [(types_pb2.DEVICE_STATE_ONLINE, "")], said


async def test_an_assignment_on_its_way_to_a_host_that_cannot_write_is_refused(
    node: str, tmp_path: Path
) -> None:
    """host.js started on a read-only data folder: it said its phone ONLINE and ran the task
    it was given, its result kept nowhere. Now its start's probe write finds the folder
    unwritable: the hello says the phone OFFLINE, saying why, and an assignment the cloud sends
    anyway (a race) is refused, FAILED, retryable, ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE,
    with the same words. Made writable again, the host says its phone ONLINE."""

    async def remount_rw(data: Path) -> None:
        remount = await asyncio.create_subprocess_exec("mount", "-o", "remount,rw", str(data))
        assert await remount.wait() == 0

    await _refused_until_writable(
        node,
        tmp_path,
        tmpfs(tmp_path / "host-data", "ro"),
        remount_rw,
        "EROFS: read-only file system",
    )


async def test_a_data_folder_refused_permission_is_a_pause_the_probe_ends(
    node: str, tmp_path: Path
) -> None:
    """host.js started on a data folder whose permissions refuse it (here `chattr +i`, which
    refuses root too: EPERM). Before, a permission error was only logged: the hello said the
    phone ONLINE and the host ran the task it was given, its result kept nowhere. Now it pauses
    as for a full disk: the hello says the phone OFFLINE with why, an assignment sent anyway is
    refused ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE with the same words, and once the folder
    takes writes again the probe says the phone ONLINE."""

    async def writable(data: Path) -> None:
        set_immutable(data, on=False)

    await _refused_until_writable(
        node,
        tmp_path,
        immutable(tmp_path / "host-data"),
        writable,
        "EPERM: operation not permitted",
    )


async def test_a_kept_result_naming_no_lease_that_cannot_be_deleted_is_not_called_unreadable(
    node: str, tmp_path: Path
) -> None:
    """A previous process kept a result that names no lease; the host reads it (not sent), but
    its folder refuses the delete (immutable: EPERM). The host says it could not delete it, and
    pauses as for any write the disk refuses. Before, the failed delete was logged as "cannot
    be read", of a file it had just read (and after "dropped")."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud = rig.cloud
        results = tmp_path / "host-data" / "node-host" / HOST_ID / "results"
        results.mkdir(parents=True)
        kept = {"held": None, "message": {"result": {"task_id": "t-old", "lease_id": ""}}}
        (results / "unnamed.json").write_text(json.dumps(kept))
        said: list[str] = []
        with immutable(results):
            host = await spawn_host(
                node, rig.address, rig.fake.pki_dir, HOST_ID, rig.adb_port, tmp_path / "host-data"
            )
            try:
                await cloud.wait_for(lambda: cloud.hellos, 60)
            finally:
                host.kill()
                assert host.stderr is not None
                said = (await host.stderr.read()).decode().splitlines()
                await host.wait()
            log = "\n".join(said)
            assert "cannot be read" not in log, log
            assert (
                "a result the previous process kept names no lease (unnamed.json): not sent, "
                "and could not be deleted (EPERM: operation not permitted" in log
            ), log
            reasons = [d.reason for d in cloud.hellos[0].devices]
            assert len(reasons) == 1 and reasons[0].startswith(PAUSED), (reasons, log)
            assert (results / "unnamed.json").exists()
