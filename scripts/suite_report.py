"""The virtual phone's task suite with the offline planner: success rate and unrequested changes.

    .venv/bin/python scripts/suite_report.py            # the suite and the held-out goals
    .venv/bin/python scripts/suite_report.py --no-ocr   # faster; toasts are then unseen
    .venv/bin/python scripts/suite_report.py -v         # with each failed task's steps

A task passes when the planner says it succeeded, its goal is met and nothing else on the phone
changed (see `host/devices/virtual/suite.py`). The figures are reported in docs/virtual-phone.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host.devices.virtual.suite import HELD_OUT, SUITE, SuiteTask
from host.devices.virtual.suite_run import TaskRun, run_task
from host.perception.ocr import OcrPool
from planner.planner import Planner
from planner.providers.offline import OfflineProvider


def _line(run: TaskRun) -> str:
    v = run.verdict
    mark = "PASS" if run.passed else "FAIL"
    extra = f" unrequested={v.unrequested}" if v.unrequested else ""
    tags = ",".join(sorted(run.task.tags))
    return (
        f"{mark} {run.task.name:34s} goal_met={v.goal_met!s:5} claimed={run.claimed!s:5} "
        f"steps={run.steps:2d} [{tags}]{extra}"
    )


async def _report(title: str, tasks: list[SuiteTask], ocr: OcrPool | None, verbose: bool) -> None:
    planner = Planner(OfflineProvider())
    runs = [await run_task(t, planner, ocr=ocr) for t in tasks]
    print(f"\n== {title}")
    for run in runs:
        print(_line(run))
        if verbose and not run.passed:
            print("   reason:", run.reason)
            for step in run.trace:
                print("   ", step[:220])
    passed = sum(r.passed for r in runs)
    unrequested = sum(bool(r.verdict.unrequested) for r in runs)
    wrong_claims = sum(r.claimed is True and not r.verdict.passed for r in runs)
    missed = sum(r.claimed is not True and r.verdict.passed for r in runs)
    interrupted = [r for r in runs if r.task.tags - {"keyboard", "time_picker", "compose"}]
    print(
        f"{title}: {passed}/{len(runs)} passed; {unrequested} with unrequested changes; "
        f"{wrong_claims} claimed success wrongly; {missed} reached the goal but did not say so; "
        f"{sum(r.passed for r in interrupted)}/{len(interrupted)} of the tasks with "
        "real-phone trouble"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-ocr", action="store_true", help="perceive without OCR")
    parser.add_argument("-v", "--verbose", action="store_true", help="print failed tasks' steps")
    args = parser.parse_args()
    ocr = None if args.no_ocr else OcrPool()
    try:
        await _report("suite", SUITE, ocr, args.verbose)
        await _report("held-out goals", HELD_OUT, ocr, args.verbose)
    finally:
        if ocr is not None:
            ocr.close()


if __name__ == "__main__":
    asyncio.run(main())
