"""A host process one of whose writes hangs on the disk, dialing the test's own fake cloud
(`lease_fake.py`, in the test's process on loopback), for the tests of a host that must stay
responsive and exit on SIGTERM while a write never returns (`test_hung_writes.py`). It runs
what `amc host run` does (`asyncio.run` of `run_host`, which stops on SIGTERM) with two
virtual phones. The hung write opens a FIFO nobody reads: the `open()` blocks for good, as a
write to a dead NFS mount or a dying disk does. Only the store method that writes is replaced
(a real SQLite write cannot be made to hang without a FUSE file system); the code around it is
the host's own.

- `end`: the attempts' end writes (`TimelineStore.finish_task`, the lease client's `ended`)
  hang, the first once it starts. The planner completes an attempt whose goal is "finish" at
  once and plans any other for ever (it writes nothing meanwhile, and keeps its lease renewed).
  Prints "ending" once the write hangs.
- `keep`: as `end`, but what hangs is keeping the finished attempt's result on disk
  (`OutboxStore.keep_result`), holding the outbox's lock as a hung SQLite write holds it.
  Prints "keeping" once the write hangs.
- `outbox`: the outbox sender's read of its head (`OutboxStore.head`) hangs, holding the
  outbox's lock as a hung SQLite read holds it. Prints "reading".
- `forget`: the delete of a forgotten phone's unhealthy mark (`TimelineStore.drop_unhealthy`)
  hangs, holding the timeline's lock. Phone `emulator-5554` is unplugged once the registry
  listed it, and forgotten after `device_forget_after_s` (0.5 s); once the delete hangs the
  process prints "dropping" and unplugs `emulator-5556`, which the device poll must still
  see.

- `progress`: attempt t1's progress writes to the timeline (`TimelineStore.update_progress`)
  hang, holding the timeline's lock; other attempts' are written. Prints "progressing".
- `step`: the step records (`TimelineStore.append_step`) hang, holding the timeline's lock.
  Prints "recording".

- `held`, `backlog`: the start's read of the results the previous process kept
  (`OutboxStore.held_results`), or of the outbox's backlog (`OutboxStore.backlog`), hangs,
  holding the outbox's lock, until a reader opens the FIFO; then the real read is made. The
  host waits for a start read 2 s (`START_READ_S`) and probes a paused data folder every
  0.5 s. `held` first keeps a result of attempt t0/1 as a previous process would have.
  Prints "reading".

- `settle`: the start's settling of what the last run left (`TimelineStore.mark_interrupted`,
  in `host.start_disk.settle_last_run`) hangs, holding the timeline's lock, before the host
  connects; the host waits for it 2 s (`START_READ_S`). Prints "settling".
- `open`: opening the timeline at start (`TimelineStore._bring_up_to_date`) hangs, holding
  its lock, before the host ever connects. Prints "opening".

Prints "stopped" when run_host returned and asyncio.run has shut its loop down.

Usage: python -m tests.host.hung_write_host TMP_DIR CLOUD_PORT MODE (end, keep, outbox, forget,
progress, step, held, backlog, settle or open)
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from amc.v1 import lease_service_pb2, types_pb2
from host import runner
from host.devices.registry import ChangeKind, DeviceInfo
from host.timeline import start_reads
from host.timeline.store import TimelineStore
from planner.decision import Decision
from planner.history import WorldEvent
from planner.scene import Scene
from tests.host.lease_fake import host_settings
from tests.host.scripted_planner import ScriptedPlanner, Step

HOST_ID = "h1"
GONE, OTHER = "emulator-5554", "emulator-5556"
#: The goal the planner completes at once (any other is planned for ever).
FINISH = "finish"


class _FinishOrPlanForEver(ScriptedPlanner):
    """Completes an attempt whose goal is `FINISH`; plans any other until it is cancelled."""

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        if goal != FINISH:
            await asyncio.Event().wait()
        return await super().decide(goal, scene, history, screenshot)


def _hang(fifo: Path, say: str) -> None:
    print(say, flush=True)
    with fifo.open("wb"):  # blocks: nobody reads
        pass


async def main(tmp: Path, port: int, hangs: str) -> None:
    settings = host_settings(tmp, port, tmp / "pki", HOST_ID).model_copy(
        update={
            "planner_transport": "direct",
            "device_poll_interval_s": 0.05,
            "device_forget_after_s": 0.5,
            "stop_grace_s": 1.0,
            "data_dir_probe_s": 0.5,
        }
    )
    fifo = tmp / "hung-disk"
    os.mkfifo(fifo)
    virtual, settings = runner.start_virtual_phones(settings)
    build = runner.build_host

    def build_hung(*args: Any, **kwargs: Any) -> runner.HostApp:
        app = build(*args, **kwargs)
        store, outbox = app.store, app.outbox
        assert outbox is not None
        if hangs == "end":

            def finish_hung(*a: Any, **kw: Any) -> None:  # the end's own write hangs
                _hang(fifo, "ending")

            store.finish_task = finish_hung  # type: ignore[method-assign]
        elif hangs == "keep":

            def keep_hung(*a: Any, **kw: Any) -> None:
                with outbox._using():  # the outbox's lock, held as a hung SQLite write holds it
                    _hang(fifo, "keeping")

            outbox.keep_result = keep_hung  # type: ignore[method-assign]
        elif hangs == "progress":
            update_progress = store.update_progress

            def progress_hung(task_id: str, *a: Any, **kw: Any) -> None:
                if task_id != "t1":
                    return update_progress(task_id, *a, **kw)
                with store._using():  # the timeline's lock, held as a hung SQLite write holds it
                    _hang(fifo, "progressing")

            store.update_progress = progress_hung  # type: ignore[method-assign]
        elif hangs == "step":

            def step_hung(*a: Any, **kw: Any) -> None:
                with store._using():  # the timeline's lock, held as a hung SQLite write holds it
                    _hang(fifo, "recording")

            store.append_step = step_hung  # type: ignore[method-assign]
        elif hangs in ("held", "backlog"):
            start_reads.START_READ_S = 2.0
            name = "held_results" if hangs == "held" else "backlog"
            read = getattr(outbox, name)
            first = threading.Lock()

            def read_hung(*a: Any, **kw: Any) -> Any:
                if first.acquire(blocking=False):
                    with outbox._using():  # the outbox's lock, as a hung SQLite read holds it
                        _hang(fifo, "reading")
                return read(*a, **kw)

            if hangs == "held":
                kept = lease_service_pb2.TaskResult(
                    task_id="t0", attempt=1, lease_id="l0", status=types_pb2.TASK_STATUS_SUCCEEDED
                )
                outbox.keep_result("t0", 1, GONE, kept.SerializeToString())
            setattr(outbox, name, read_hung)
        elif hangs == "outbox":
            head = outbox.head
            once = threading.Lock()

            def head_hung(*a: Any, **kw: Any) -> Any:
                if not once.acquire(blocking=False):
                    return head(*a, **kw)
                with outbox._using():  # the outbox's lock, held as a hung SQLite read holds it
                    _hang(fifo, "reading")

            outbox.head = head_hung  # type: ignore[method-assign]
        else:

            def drop_hung(serial: str) -> None:
                with store._using():  # the timeline's lock, held as a hung SQLite delete
                    threading.Timer(0.2, virtual.unplug, [OTHER]).start()
                    _hang(fifo, "dropping")

            def unplug_once_seen(info: DeviceInfo, kind: ChangeKind) -> None:
                if (info.serial, kind) == (GONE, "online"):  # listed first, then gone
                    virtual.unplug(GONE)

            store.drop_unhealthy = drop_hung  # type: ignore[method-assign]
            app.registry.add_listener(unplug_once_seen)
        return app

    runner.build_host = build_hung
    if hangs == "settle":
        start_reads.START_READ_S = 2.0

        def settle_hung(store: TimelineStore) -> list[tuple[str, int]]:
            with store._using():  # the timeline's lock, held as a hung SQLite write holds it
                _hang(fifo, "settling")
            return []

        TimelineStore.mark_interrupted = settle_hung  # type: ignore[assignment]
    elif hangs == "open":

        def open_hung(store: TimelineStore) -> None:  # called holding the timeline's lock
            _hang(fifo, "opening")

        TimelineStore._bring_up_to_date = open_hung  # type: ignore[assignment,method-assign]
    try:
        await runner.run_host(
            settings.model_copy(update={"device_source": "adb"}),
            planner=_FinishOrPlanForEver([Step("complete", {"success": True, "reason": "done"})]),
        )
    finally:
        await asyncio.to_thread(virtual.stop)
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
