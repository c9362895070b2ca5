"""Resident memory: the cloud per connected host stream, and a host agent with 1 and 4 phones.

* Cloud: VmRSS of the cloud process (SQLite) with 0, 500 and 2,000 connected idle hosts, each on its
  own mTLS Lease stream; the per-stream cost is the slope. Baseline in the same run: the bare
  grpc.aio echo server with the same streams (what gRPC itself costs per stream).
* Host: VmRSS of `amc host run` (adbutils driver, OCR on, the cloud planner transport) while its
  phones run tasks, sampled every 0.2 s; the virtual phones run behind an adb server in another
  process, as real phones would be other devices. Baseline: the same host process idle
  (connected, before any task). The full size also runs 4 phones with OCR off, which shows how
  much of the host's memory is the Tesseract engines.

    python -m bench.memory [--smoke]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from bench import command, resources
from bench.cloud_client import operator
from bench.procstat import rss_kb
from bench.report import Section
from bench.servers import ROOT, ServerProcess, server_env, server_process
from bench.sim_hosts import Fleet, WorkerConfig, host_ids, split

GOALS = [
    "Turn on dark theme",
    "Turn off Wi-Fi",
    "Enable battery saver",
    "Turn off Bluetooth",
    "Turn on airplane mode",
    "Open About phone",
]
HOST_ID = "bench-host"
TERMINAL = {
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_CANCELLED,
}


@dataclass(slots=True)
class Sizes:
    levels: list[int]
    workers: int
    settle: float
    tasks_per_phone: int
    phones: tuple[int, ...]
    host_idle_settle: float
    ocr_off_run: bool = False


FULL = Sizes(
    [0, 500, 2000],
    workers=2,
    settle=3.0,
    tasks_per_phone=3,
    phones=(1, 4),
    host_idle_settle=4.0,
    ocr_off_run=True,
)
#: Smoke: one level of streams past none is a slope already (each level is a client process
#: started and connected, twice: the cloud and the echo baseline).
SMOKE = Sizes([0, 10], workers=1, settle=0.5, tasks_per_phone=1, phones=(1,), host_idle_settle=2.0)


def _settled_rss(pid: int, settle: float) -> int:
    """RSS after `settle` seconds, the median of a few samples."""
    time.sleep(settle)
    samples = []
    for _ in range(5):
        samples.append(rss_kb(pid))
        time.sleep(0.1)
    return sorted(samples)[len(samples) // 2]


def stream_rss(
    kind: str, args: list[str], ids: list[str], pki_dir: Path, sizes: Sizes
) -> list[int]:
    """RSS (KiB) of a server at each level of connected idle hosts."""
    rss: list[int] = []
    fleets: list[Fleet] = []
    with server_process(kind, *args) as server:
        try:
            connected = 0
            for level in sizes.levels:
                if level > connected:
                    chunk = ids[connected:level]
                    fleet = Fleet(
                        [
                            WorkerConfig(
                                i, "grpc", server.address, pki_dir, c, wait_assignment=False
                            )
                            for i, c in enumerate(split(chunk, sizes.workers))
                        ]
                    )
                    fleets.append(fleet)
                    fleet.start()
                    if fleet.failed:
                        raise RuntimeError(f"{fleet.failed} hosts could not connect to {kind}")
                    connected = level
                rss.append(_settled_rss(server.pid, sizes.settle))
        finally:
            for fleet in fleets:
                fleet.stop()
    return rss


def _amc() -> list[str]:
    script = Path(sys.executable).parent / "amc"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from console.cli import main; main()"]


async def _run_tasks(
    address: str, pki_dir: Path, goals: list[str], pid: int
) -> tuple[int, int, int]:
    """Submit the goals, sample RSS until they end; (peak KiB, succeeded, total)."""
    client = operator(address, pki_dir)
    peak = 0
    try:
        ids = []
        for goal in goals:
            r = await client.tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(goal=goal))
            ids.append(r.task.task_id)
        deadline = time.monotonic() + 300
        statuses: dict[str, int] = {}
        tick = 0
        while time.monotonic() < deadline:
            peak = max(peak, rss_kb(pid))
            tick += 1
            if tick % 5 == 0:
                for task_id in ids:
                    if statuses.get(task_id) not in TERMINAL:
                        t = await client.tasks.GetTask(
                            task_service_pb2.GetTaskRequest(task_id=task_id)
                        )
                        statuses[task_id] = t.task.status
                if all(statuses.get(t) in TERMINAL for t in ids):
                    break
            await asyncio.sleep(0.2)
        ok = sum(1 for t in ids if statuses.get(t) == types_pb2.TASK_STATUS_SUCCEEDED)
        return peak, ok, len(ids)
    finally:
        await client.close()


def host_rss(
    cloud: ServerProcess,
    adb: ServerProcess,
    pki_dir: Path,
    phones: int,
    sizes: Sizes,
    *,
    ocr: bool = True,
) -> tuple[int, int, int, int]:
    """(idle KiB, peak KiB while running tasks, succeeded, submitted) of one host process."""
    data = Path(tempfile.mkdtemp(prefix="amc-bench-host-"))
    env = server_env()
    env.update(
        AMC_HOST_DATA_DIR=str(data),
        AMC_HOST_DEVICE_SOURCE="adb",
        AMC_HOST_DRIVER="adbutils",
        AMC_HOST_ADB_HOST="127.0.0.1",
        AMC_HOST_ADB_PORT=adb.address.rsplit(":", 1)[1],
        AMC_HOST_CLOUD_ADDRESS=cloud.address,
        AMC_HOST_CERTS_DIR=str(pki_dir),
        AMC_HOST_HOST_ID=HOST_ID,
        AMC_HOST_TLS_SERVER_NAME="localhost",
        AMC_HOST_PLANNER_TRANSPORT="cloud",
        AMC_HOST_OCR_ENABLED="1" if ocr else "0",
        AMC_HOST_SETTLE_DELAY_S="0.05",
        AMC_HOST_MAX_STEPS="30",
    )
    log = data / "host.log"
    with log.open("w") as err:
        proc = subprocess.Popen([*_amc(), "host", "run"], cwd=ROOT, env=env, stderr=err, stdout=err)
    try:
        idle = _settled_rss(proc.pid, sizes.host_idle_settle)
        if proc.poll() is not None:
            raise RuntimeError(f"host exited early:\n{log.read_text()[-3000:]}")
        goals = [GOALS[i % len(GOALS)] for i in range(phones * sizes.tasks_per_phone)]
        peak, ok, total = asyncio.run(_run_tasks(cloud.address, pki_dir, goals, proc.pid))
        return idle, peak, ok, total
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def run(smoke: bool) -> Section:
    sizes = SMOKE if smoke else FULL
    t0 = time.monotonic()
    top = sizes.levels[-1]
    section = Section(
        "memory",
        "Memory",
        f"cloud (SQLite) at {', '.join(map(str, sizes.levels))} connected idle hosts; host agent "
        f"with {' and '.join(map(str, sizes.phones))} virtual phone(s), "
        f"{sizes.tasks_per_phone} task(s) per phone, OCR on",
    )
    ids = host_ids(top)
    pki_dir = resources.pki([*ids, HOST_ID])
    with tempfile.TemporaryDirectory(prefix="amc-bench-mem-") as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'cloud.sqlite3'}"
        ours = stream_rss("cloud", ["--db", url, "--pki", str(pki_dir)], ids, pki_dir, sizes)
    echo = stream_rss("echo", ["--pki", str(pki_dir)], ids, pki_dir, sizes)
    for level, o, e in zip(sizes.levels, ours, echo, strict=True):
        section.add(
            f"cloud RSS, {level} hosts",
            round(o / 1024, 1),
            "MiB",
            baseline=round(e / 1024, 1),
            baseline_name="bare gRPC echo",
        )
    for level, o, e in zip(sizes.levels[1:], ours[1:], echo[1:], strict=True):
        per = (o - ours[0]) / level
        per_echo = (e - echo[0]) / level
        section.add(
            f"cloud KiB per idle stream (0→{level})",
            round(per, 1),
            "KiB",
            baseline=round(per_echo, 1),
            baseline_name="bare gRPC echo",
            note=f"target < 150 KB: {'met' if per * 1.024 < 150 else 'NOT met'}",
        )
    with tempfile.TemporaryDirectory(prefix="amc-bench-mem-") as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'cloud.sqlite3'}"
        with server_process("cloud", "--db", url, "--pki", str(pki_dir)) as cloud:
            runs = [(phones, True) for phones in sizes.phones]
            if sizes.ocr_off_run:
                runs.append((max(sizes.phones), False))
            for phones, ocr in runs:
                with server_process("adb", "--phones", str(phones)) as adb:
                    idle, peak, ok, total = host_rss(cloud, adb, pki_dir, phones, sizes, ocr=ocr)
                note = f"{ok}/{total} tasks succeeded"
                if phones == 4 and ocr:
                    met = peak * 1.024 / 1000 < 250
                    note += f"; target < 250 MB: {'met' if met else 'NOT met'}"
                section.add(
                    f"host agent peak RSS, {phones} phone(s) running tasks"
                    + ("" if ocr else ", OCR off"),
                    round(peak / 1024, 1),
                    "MiB",
                    baseline=round(idle / 1024, 1),
                    baseline_name="same host idle",
                    note=note,
                )
    section.notes.append(
        "RSS is VmRSS from /proc/<pid>/status; cloud figures are medians of 5 samples after the "
        "streams settled, host figures the peak of 0.2 s samples while tasks ran."
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
