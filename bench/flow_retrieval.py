"""Flow retrieval: the CPU one assignment spends choosing learned flows, by how many are active.

At assignment the dispatcher scores the task's goal against every active flow (up to 2,000) on
the event loop. A fresh SQLite store gets N flows (distinct goal templates, the dark-theme
path's steps); then the same goal is retrieved repeatedly, as a dispatch burst does: with the
active flows kept between retrievals (how the cloud runs, `cloud/flows/retrieval.py`), against
the baseline of reading and parsing them for every retrieval (a new `Retriever` each time: what
every retrieval paid before they were kept). The choice is recorded on an attempt each time, as
at assignment.

    python -m bench.flow_retrieval [--smoke] [--flows N]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bench import command
from bench.report import Section
from bench.servers import ROOT
from cloud.flows.retrieval import Retriever
from cloud.settings import CloudSettings
from cloud.store import flows
from cloud.store.database import Store
from cloud.store.engine import upgrade
from planner.flows.synthesis import synthesize

_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]
GOAL = "Turn on dark theme"


async def _measure(flow_count: int, rounds: int, tmp: Path) -> tuple[float, float]:
    """CPU ms per retrieval: kept candidates, and read-and-parsed each time."""
    if str(ROOT) not in sys.path:  # the tests' flow steps (not an installed package)
        sys.path.insert(0, str(ROOT))
    from tests.support.flows import dark_theme_steps

    store = Store.from_url(f"sqlite+aiosqlite:///{tmp / 'cloud.sqlite3'}")
    try:
        await upgrade(store.engine)
        for i in range(flow_count):
            w = len(_WORDS)
            made = synthesize(
                f"Turn on {_WORDS[i % w]} {_WORDS[i // w % w]} {i}", dark_theme_steps()
            )
            assert made.flow is not None
            await flows.add(store, made.flow, f"{made.fingerprint}-{i}", f"src-{i}", 1)
        settings = CloudSettings(pki_dir=tmp)
        kept = Retriever(store, settings)
        await kept.for_new_attempt("warm-up", 1, GOAL, no_replay=False)

        async def per_retrieval(fresh: bool) -> float:
            start = time.process_time()
            for n in range(rounds):
                retriever = Retriever(store, settings) if fresh else kept
                await retriever.for_new_attempt(f"t{n}", 1, GOAL, no_replay=False)
            return (time.process_time() - start) / rounds * 1000

        # alternated, so drift on a noisy machine falls on both alike
        kept_ms = fresh_ms = 0.0
        for _ in range(2):
            fresh_ms += await per_retrieval(True) / 2
            kept_ms += await per_retrieval(False) / 2
        return kept_ms, fresh_ms
    finally:
        await store.close()


def run(smoke: bool, flow_count: int | None = None) -> Section:
    sizes = [flow_count] if flow_count else ([20] if smoke else [100, 1000])
    rounds = 5 if smoke else 20
    t0 = time.monotonic()
    section = Section(
        "flow_retrieval",
        "Flow retrieval at assignment",
        f"{', '.join(map(str, sizes))} active flows, {rounds} retrievals per way, SQLite",
    )
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="amc-bench-flows-") as tmp:
            kept_ms, fresh_ms = asyncio.run(_measure(n, rounds, Path(tmp)))
        section.add(
            f"{n} flows: CPU per retrieval, candidates kept",
            round(kept_ms, 2),
            "ms",
            baseline=round(fresh_ms, 2),
            baseline_name="read and parsed per retrieval",
        )
    section.notes.append(
        "One process, no gRPC: `Retriever.for_new_attempt` (score every active flow lexically, "
        "record the choice on the attempt). No flow matches the goal, so every one is scored."
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--flows", type=int)
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke, args.flows))


if __name__ == "__main__":
    raise SystemExit(main())
