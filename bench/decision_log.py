"""The decision log at scale on PostgreSQL: ListDecisions latency and the retention prune.

1. Load the decisions table fast (one `INSERT … SELECT generate_series` per chunk, done by the
   server): 100 decisions per task, prompts of realistic length. Half of the tasks ended 30 days
   ago (past the 7-day retention), half an hour ago.
2. `ListDecisions` for one task (a page of 100) through the real gRPC service of a cloud process,
   p50/p99 over random tasks, first with 1 % of the rows loaded (baseline), then with all of them.
3. Insert latency of `cloud.store.decisions.append` (the planner's real write path) from 4
   concurrent writers: first alone (baseline), then while `cloud.store.decisions.prune` deletes the
   expired half in its batches from another process.
4. The fleet's spending today as the daily cap reads it before each Decide, with a busy day's
   decisions logged today: `cloud.store.spend.DailySpend.today` at 100 calls/s (what the cap
   reads now) against summing the day's rows (`spend.spent_since`, what it read per call before).

    python -m bench.decision_log [--smoke] [--rows N]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing as mp
import random
import time
from typing import Any

import psycopg

from amc.v1 import decision_log_service_pb2, types_pb2
from bench import command, resources
from bench.cloud_client import operator
from bench.report import Section, percentile
from bench.servers import async_server_process
from cloud.metrics import start_of_day
from cloud.store import decisions, spend
from cloud.store.database import Store
from cloud.store.engine import upgrade_sync
from planner.decision import Decision, Usage

PER_TASK = 100
WRITERS = 4

_SYSTEM = "You operate an Android phone for the user. " * 4
_USER = (
    "Goal: Turn on dark theme. Screen: Settings > Display. Elements: e1 'Dark theme' switch off, "
    "e2 'Brightness level', e3 'Adaptive brightness', e4 'Screen timeout'. History: step 1 opened "
    "Settings (ok); step 2 tapped Display (ok). "
) * 2


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def load(url: str, first_task: int, tasks: int) -> None:
    """Tasks [first_task, first_task + tasks) and PER_TASK decisions each, server-side."""
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO tasks (task_id, goal, status, attempt, max_attempts, host_id,
                device_serial, lease_seconds, deadline, cancel_requested, created_at, updated_at,
                finished_at)
            SELECT 'bench' || lpad(g::text, 10, '0'), 'Turn on dark theme', 'SUCCEEDED', 1, 3,
                'host-' || (g %% 500), 'emulator-5554', 30, now(), false,
                now() - CASE WHEN g %% 2 = 0 THEN interval '31 days' ELSE interval '2 hours' END,
                now(),
                now() - CASE WHEN g %% 2 = 0 THEN interval '30 days' ELSE interval '1 hour' END
            FROM generate_series(%s::bigint, %s::bigint) AS g
            """,
            (first_task, first_task + tasks - 1),
        )
        chunk = 2000  # tasks per statement (200,000 rows)
        for start in range(first_task, first_task + tasks, chunk):
            end = min(start + chunk, first_task + tasks) - 1
            conn.execute(
                """
                INSERT INTO decisions (decision_id, host_id, task_id, attempt, step_index,
                    provider, model, system_prompt, user_prompt, tool_name, arguments_json,
                    action_pb, rationale, thinking, purpose, expected_outcome, input_tokens,
                    output_tokens, cache_read_input_tokens, cache_creation_input_tokens,
                    thinking_tokens, latency_seconds, forced_retry, corrective_retries, created_at)
                SELECT md5(t::text || ':' || s::text), 'host-' || (t %% 500),
                    'bench' || lpad(t::text, 10, '0'), 1, s, 'offline', 'offline-1',
                    %s, %s, 'tap', '{"element_id": "e1"}', NULL,
                    'Display is open; the Dark theme switch is off, so tap it.',
                    '[]'::json, 'Turn on dark theme', 'The Dark theme switch shows on',
                    1200 + s, 60, 0, 0, 0, 0.4, false, 0,
                    now() - interval '30 days' + s * interval '1 second'
                FROM generate_series(%s::bigint, %s::bigint) AS t,
                     generate_series(1, %s) AS s
                """,
                (_SYSTEM, _USER, start, end, PER_TASK),
            )
        conn.execute("ANALYZE tasks")
        conn.execute("ANALYZE decisions")


def _task_id(n: int) -> str:
    return f"bench{n:010d}"


async def list_latency(address: str, pki_dir: Any, tasks: int, calls: int) -> list[float]:
    """ListDecisions (a page of 100) for random tasks among the first `tasks`; seconds."""
    client = operator(address, pki_dir)
    rng = random.Random(7)
    out: list[float] = []
    try:
        for i in range(-5, calls):
            request = decision_log_service_pb2.ListDecisionsRequest(
                task_id=_task_id(rng.randrange(tasks)), page_size=PER_TASK
            )
            t0 = time.perf_counter()
            response = await client.decisions.ListDecisions(request)
            if i >= 0:
                out.append(time.perf_counter() - t0)
            if len(response.decisions) != PER_TASK:
                raise RuntimeError(f"ListDecisions gave {len(response.decisions)} rows")
    finally:
        await client.close()
    return out


def _decision() -> Decision:
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e1"},
        action=types_pb2.Action(tap=types_pb2.TapAction(element_id="e1")),
        purpose="Turn on dark theme",
        expected_outcome="The Dark theme switch shows on",
        rationale="Display is open; the Dark theme switch is off, so tap it.",
        thinking=[],
        usage=Usage(input_tokens=1200, output_tokens=60),
        provider="offline",
        model="offline-1",
        latency_s=0.4,
        forced_retry=False,
        system_prompt=_SYSTEM,
        user_prompt=_USER,
    )


async def insert_latency(url: str, until: Any, min_seconds: float) -> list[float]:
    """Append decisions from WRITERS tasks until `until()` is true (and at least min_seconds)."""
    store = Store.from_url(url)
    out: list[float] = []
    decision = _decision()
    start = time.monotonic()

    async def writer(w: int) -> None:
        task = f"live{w:04d}{int(start * 1000) % 10**9:09d}"
        while time.monotonic() - start < min_seconds or not until():
            t0 = time.perf_counter()
            await decisions.append(store, "host-live", task, 1, decision)
            out.append(time.perf_counter() - t0)

    try:
        await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    finally:
        await store.close()
    return out


def load_today(url: str, rows: int) -> None:
    """`rows` decisions made today (spread over the hours since midnight UTC), server-side."""
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO decisions (decision_id, host_id, task_id, attempt, step_index,
                provider, model, system_prompt, user_prompt, tool_name, arguments_json,
                rationale, thinking, purpose, expected_outcome, input_tokens, output_tokens,
                cache_read_input_tokens, cache_creation_input_tokens, thinking_tokens,
                latency_seconds, forced_retry, corrective_retries, cost_usd, created_at)
            SELECT md5('today:' || g::text), 'host-' || (g %% 500),
                'today' || lpad((g / 100)::text, 10, '0'), 1, g %% 100, 'anthropic', 'm',
                'system', 'user', 'tap', '{}', 'why', '[]'::json, 'p', 'e',
                1200, 60, 0, 0, 0, 0.4, false, 0, 0.004,
                greatest(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
                         now() - (g %% 36000) * interval '1 second')
            FROM generate_series(1, %s) AS g
            """,
            (rows,),
        )
        conn.execute("ANALYZE decisions")


async def spend_today(
    url: str, seconds: float, rate: float
) -> tuple[list[float], list[float], int]:
    """Seconds per `DailySpend.today` call at `rate` calls/s for `seconds`, seconds per exact
    sum of the day (`spent_since`, 20 calls), and the sums `DailySpend` read."""
    store = Store.from_url(url)
    try:
        daily = spend.DailySpend(store)
        cached: list[float] = []
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            t0 = time.perf_counter()
            await daily.today(start_of_day(store.now()))
            cached.append(time.perf_counter() - t0)
            n += 1
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
        exact: list[float] = []
        for _ in range(20):
            t0 = time.perf_counter()
            await spend.spent_since(store, start_of_day(store.now()))
            exact.append(time.perf_counter() - t0)
        return cached, exact, daily.reads
    finally:
        await store.close()


def _prune_main(url: str, result: Any, go_event: Any) -> None:
    async def go() -> tuple[int, float]:
        store = Store.from_url(url)
        result.put("ready")
        go_event.wait()
        t0 = time.perf_counter()
        try:
            removed = await decisions.prune(store, dt.timedelta(days=7), batch_size=1000)
        finally:
            await store.close()
        return removed, time.perf_counter() - t0

    result.put(asyncio.run(go()))


def prune_with_inserts(
    url: str, baseline_seconds: float
) -> tuple[list[float], list[float], int, float]:
    """(insert latencies alone, during the prune, rows pruned, prune seconds)."""
    alone = asyncio.run(insert_latency(url, lambda: True, baseline_seconds))
    ctx = mp.get_context("spawn")
    result: Any = ctx.Queue()
    go_event = ctx.Event()
    proc = ctx.Process(target=_prune_main, args=(url, result, go_event))
    proc.start()
    # The child imports and connects first, so its start-up is not counted against the inserts.
    if result.get(timeout=120) != "ready":
        raise RuntimeError("prune process did not start")
    go_event.set()
    during = asyncio.run(insert_latency(url, lambda: not proc.is_alive(), 0.5))
    removed, seconds = result.get(timeout=60)
    proc.join()
    return alone, during, removed, seconds


def run(smoke: bool, rows: int | None = None) -> Section:
    rows = rows or (5_000 if smoke else 1_000_000)
    tasks = rows // PER_TASK
    baseline_tasks = max(2, tasks // 100)
    calls = 30 if smoke else 300
    t0 = time.monotonic()
    section = Section(
        "decision_log",
        "Decision log at scale (PostgreSQL)",
        f"{tasks * PER_TASK:,} decisions ({tasks:,} tasks × {PER_TASK}); half past retention",
    )
    url = resources.postgres_url()
    upgrade_sync(url)
    pki_dir = resources.pki([])
    load(url, 0, baseline_tasks)

    async def listing(n_tasks: int) -> list[float]:
        async with async_server_process(
            "cloud", "--db", url, "--pki", str(pki_dir), "--retention-days", "36500"
        ) as server:
            return await list_latency(server.address, pki_dir, n_tasks, calls)

    small = [x * 1000 for x in asyncio.run(listing(baseline_tasks))]
    t_load = time.monotonic()
    load(url, baseline_tasks, tasks - baseline_tasks)
    load_s = time.monotonic() - t_load
    big = [x * 1000 for x in asyncio.run(listing(tasks))]
    for q in (50, 99):
        section.add(
            f"ListDecisions (page of {PER_TASK}) p{q}, {tasks * PER_TASK:,} rows",
            round(percentile(big, q), 2),
            "ms",
            baseline=round(percentile(small, q), 2),
            baseline_name=f"{baseline_tasks * PER_TASK:,} rows",
        )
    alone, during, removed, prune_s = prune_with_inserts(url, 1.5 if smoke else 10.0)
    a_ms = [x * 1000 for x in alone]
    d_ms = [x * 1000 for x in during]
    for q in (50, 99):
        section.add(
            f"decision insert p{q} during prune",
            round(percentile(d_ms, q), 2),
            "ms",
            baseline=round(percentile(a_ms, q), 2),
            baseline_name="without prune",
        )
    section.add("prune: rows deleted", removed, note=f"{prune_s:.1f} s in batches of 1,000")
    section.add("prune: rows/s", round(removed / prune_s) if prune_s else 0, "/s")
    section.add(
        "inserts during prune", len(during), note=f"{WRITERS} writers; {len(alone)} without prune"
    )
    today_rows = 2_000 if smoke else 200_000
    load_today(url, today_rows)
    cached, exact, reads = asyncio.run(spend_today(url, 2.0 if smoke else 10.0, 100.0))
    c_ms, e_ms = [x * 1000 for x in cached], [x * 1000 for x in exact]
    for q in (50, 99):
        section.add(
            f"today's fleet spending per Decide p{q}, {today_rows:,} decisions today",
            round(percentile(c_ms, q), 3),
            "ms",
            baseline=round(percentile(e_ms, q), 2),
            baseline_name="summing the day's rows (before)",
            note=f"{len(cached):,} calls at 100/s; {reads} sums read" if q == 50 else "",
        )
    section.notes.append(
        f"Bulk load of {(tasks - baseline_tasks) * PER_TASK:,} rows took {load_s:.1f} s "
        "(server-side INSERT … SELECT generate_series, 200,000 rows per statement)."
    )
    section.notes.append(
        "The prune runs in its own process (as the cloud's retention job would, in another "
        "replica or loop) while 4 writers append through `decisions.append` in this one."
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--rows", type=int)
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke, args.rows))


if __name__ == "__main__":
    raise SystemExit(main())
