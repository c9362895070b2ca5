"""Several phones on one host: one phone's trouble must not stall the others.

Real parts: the adb driver over the adb protocol against the virtual adb server, the agent
loop, the offline planner."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from host.agent.loop import AgentLoop, LoopSettings, TaskOutcome, TaskSpec
from host.devices.adb_driver import AdbDriver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.suite import SUITE, snapshot
from host.perception.perceive import Perceiver
from planner.planner import make_planner
from planner.settings import PlannerSettings
from tests.support.waiting import until


def _agent(phone: VirtualPhone, port: int) -> AgentLoop:
    return AgentLoop(
        # A long timeout: the wedged phones stay inside their call for the whole test.
        AdbDriver(phone.serial, port=port, timeout_s=600),
        make_planner(PlannerSettings(provider="offline")),
        Perceiver(None, retry_delay_s=0),
        None,
        LoopSettings(max_steps=30, settle_delay_s=0, ocr=False),
    )


def test_wedged_phones_do_not_stall_the_other_phones() -> None:
    """Every phone's driver calls ran in asyncio's default thread pool (min(32, cores + 4)
    threads: 6 on a 2-core host), where a call abandoned on cancel keeps its thread too. As
    many phones stuck in a call (a `uiautomator dump` that never finds an idle screen, with
    the adb driver's 30 s per read, or forever before the u2 driver's timeout was bounded)
    held every thread, and a healthy phone's task, and anything else the host runs there,
    waited for them. Each phone's calls now run in a worker of its own. Here a pool of two
    threads stands for the host's six, so two wedged phones are enough to show it. (The
    wait_for is a safety net for the test run only: before the fix it ran out.)"""
    task = next(t for t in SUITE if t.name == "dark_theme_on")
    wedged = [VirtualPhone(f"wedged-{i}") for i in range(2)]
    healthy = task.new_phone("healthy-1")
    task.setup(healthy)
    before = snapshot(healthy)
    for phone in wedged:
        phone.hang_dumps(600.0, count=10)

    def _spec(phone: VirtualPhone) -> TaskSpec:
        return TaskSpec(f"t-{phone.serial}", 1, task.goal, phone.serial)

    async def run(server: ThreadedAdbServer) -> tuple[TaskOutcome, list[TaskOutcome]]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        cancel = asyncio.Event()
        stuck = [
            asyncio.create_task(_agent(p, server.port).run(_spec(p), cancel=cancel)) for p in wedged
        ]
        try:
            await until(lambda: all(p.dumper is not None for p in wedged), what="stuck dumps")
            healthy_run = _agent(healthy, server.port).run(_spec(healthy))
            outcome = await asyncio.wait_for(healthy_run, 30)
            assert not any(t.done() for t in stuck)  # the wedged phones are still stuck
            cancel.set()
            return outcome, list(await asyncio.gather(*stuck))
        finally:
            for p in wedged:  # ends the hung dumps (and the reads waiting on them)
                server.unplug(p.serial)

    with ThreadedAdbServer([*wedged, healthy]) as server:
        outcome, stopped = asyncio.run(run(server))
    assert outcome.status == "succeeded", outcome.summary
    assert task.verdict(healthy, before).passed
    assert [o.status for o in stopped] == ["cancelled", "cancelled"]
