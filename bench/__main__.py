"""Run every benchmark and write the figures into docs/benchmarks.md.

    python -m bench                      # full sizes, writes docs/benchmarks.md
    python -m bench --smoke              # tiny sizes (CI), prints only
    python -m bench --only lease_capacity --only memory
    python -m bench --smoke --write --output /tmp/benchmarks.md

Each benchmark's figures replace its own block in the document (between
`<!-- bench:NAME -->` and `<!-- /bench:NAME -->`), so `--only` keeps the other blocks.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import (
    decision_log,
    dispatch_burst,
    dispatch_latency,
    fleet_scale,
    fleet_watch,
    flow_retrieval,
    host_heartbeat,
    lease_capacity,
    machine,
    memory,
    renewal_writes,
    replica_restart,
    resources,
)
from bench.report import Section
from bench.servers import ROOT, server_env

DOC = ROOT / "docs" / "benchmarks.md"


def _script(name: str, title: str, smoke_args: list[str]) -> Callable[[bool], Section]:
    """A benchmark written as a script by another part (planner, host): run it, keep its output."""

    def run(smoke: bool) -> Section:
        t0 = time.monotonic()
        args = [sys.executable, str(ROOT / "bench" / f"{name}.py"), *(smoke_args if smoke else [])]
        done = subprocess.run(
            args, cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=1800
        )
        if done.returncode != 0:
            raise RuntimeError(f"{name}.py exited {done.returncode}:\n{done.stderr[-3000:]}")
        section = Section(name, title, "smoke" if smoke else "full", raw=done.stdout)
        section.notes.append(f"Output of `python bench/{name}.py{' --smoke' if smoke else ''}`.")
        section.seconds = time.monotonic() - t0
        return section

    return run


BENCHMARKS: dict[str, Callable[[bool], Section]] = {
    "lease_capacity": lease_capacity.run,
    "observability_overhead": lease_capacity.run_overhead,
    "memory": memory.run,
    "dispatch_latency": dispatch_latency.run,
    "dispatch_burst": dispatch_burst.run,
    "replica_restart": replica_restart.run,
    "flow_retrieval": flow_retrieval.run,
    "fleet_scale": fleet_scale.run,
    "fleet_watch": fleet_watch.run,
    "host_heartbeat": host_heartbeat.run,
    "renewal_writes": renewal_writes.run,
    "decision_log": decision_log.run,
    "prompt_growth": _script("prompt_growth", "Prompt growth (planner)", ["--smoke"]),
    "host_overhead": _script("host_overhead", "Host per-step overhead", ["--smoke"]),
    "flow_replay": _script("flow_replay", "Learned flows: the suite twice", ["--smoke"]),
}


def _block(name: str, body: str) -> str:
    return f"<!-- bench:{name} -->\n{body.rstrip()}\n<!-- /bench:{name} -->"


def write_doc(path: Path, sections: list[Section], smoke: bool, described: str) -> None:
    """Replace each benchmark's block in the document (appending blocks that are missing)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n## Results\n"
    for s in sections:
        stamp = f"_{'Smoke' if smoke else 'Full'} run on {described}._\n\n"
        block = _block(s.name, stamp + s.markdown())
        pattern = re.compile(
            rf"<!-- bench:{re.escape(s.name)} -->.*?<!-- /bench:{re.escape(s.name)} -->", re.S
        )
        if pattern.search(text):

            def keep(_match: re.Match[str], b: str = block) -> str:
                return b

            text = pattern.sub(keep, text)
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="amc benchmarks")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds each")
    parser.add_argument(
        "--only", action="append", choices=sorted(BENCHMARKS), help="run only these (repeatable)"
    )
    parser.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the figures into the document (default: yes for full runs, no for --smoke)",
    )
    parser.add_argument("--output", type=Path, default=DOC, help="document to write")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    described = machine.describe()
    print(f"amc benchmarks ({'smoke' if args.smoke else 'full'}) on {described}", flush=True)
    sections: list[Section] = []
    failed: list[str] = []
    t0 = time.monotonic()
    try:
        for name in names:
            try:
                section = BENCHMARKS[name](args.smoke)
            except Exception:
                failed.append(name)
                print(f"== {name}: FAILED\n{traceback.format_exc()}", flush=True)
                continue
            sections.append(section)
            print(section.text(), flush=True)
    finally:
        resources.close()
    print(f"{len(sections)} benchmark(s) done in {time.monotonic() - t0:.1f} s", flush=True)
    write = (not args.smoke) if args.write is None else args.write
    if write and sections:
        write_doc(args.output, sections, args.smoke, described)
        print(f"figures written to {args.output}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
