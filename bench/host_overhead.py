"""Per-step host overhead, and OCR through a reused tesserocr engine against a per-image baseline.

What it measures, on screens of the virtual phone (no model calls: planning is not host
overhead):

* perception without OCR: screenshot + hierarchy dump + parse, through the in-process driver;
* perception with OCR: the same plus OCR of the screenshot and fusion into the scene;
* recording: two screenshots to the artifact folder and one timeline row into SQLite;
* outbox: what a direct-transport step writes for the cloud in its own path (the decision, the
  decision again with its outcome, two screenshots: four durable SQLite rows), as a ratio to
  recording measured in the same run;
* OCR alone, three ways: the host's reused engine (one per worker thread), a new tesserocr engine
  per image, and — when the `tesseract` binary is installed — one `tesseract` process per image,
  as pytesseract does. Without the binary the per-image engine is the baseline (reported so).

Run: `python bench/host_overhead.py` (or `--smoke` for a quick small run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from amc.v1 import types_pb2
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.outbox import OutboxStore, Shipments
from host.perception.ocr import OcrEngine, OcrPool, default_tessdata_path
from host.perception.perceive import Perceiver
from host.timeline.record import TimelineRecord
from host.timeline.store import TimelineStore
from planner.decision import Decision, Usage

SCREENS = [
    ("home", None, []),
    ("settings", "com.android.settings", []),
    ("display", "com.android.settings", ["display"]),
    ("contacts", "com.android.contacts", []),
    ("clock", "com.android.deskclock", []),
]


#: The smoke run's screens: one with no app open, one app's page (every path, fewer OCR reads,
#: each of which costs a second or more on a loaded CI machine).
SMOKE_SCREENS = SCREENS[:2]


def _phones(screens: list[tuple[str, str | None, list[str]]]) -> list[VirtualPhone]:
    phones = []
    for i, (_, package, pages) in enumerate(screens):
        phone = VirtualPhone(f"bench-{i}")
        if package:
            phone.launch(package)
            for page in pages:
                phone.push(page)
        phones.append(phone)
    return phones


def _decision() -> Decision:
    action = types_pb2.Action(purpose="open it", expected_outcome="it opens")
    action.tap.element_id = "e1"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e1"},
        action=action,
        purpose="open it",
        expected_outcome="it opens",
        rationale="r" * 400,
        thinking=[],
        usage=Usage(input_tokens=3000, output_tokens=120),
        provider="offline",
        model="bench",
        latency_s=0.1,
        forced_retry=False,
        system_prompt="s" * 4000,
        user_prompt="u" * 6000,
    )


def _time(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _ms(samples: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(samples) * 1000, 2),
        "mean_ms": round(statistics.fmean(samples) * 1000, 2),
        "n": len(samples),
    }


def run(
    repeat: int, screens: list[tuple[str, str | None, list[str]]] = SCREENS
) -> dict[str, object]:
    phones = _phones(screens)
    drivers = [VirtualDriver(p) for p in phones]
    pngs = [p.screenshot_png() for p in phones]
    pool = OcrPool()
    results: dict[str, object] = {"repeat_per_screen": repeat, "screens": [s[0] for s in screens]}
    try:
        perceiver = Perceiver(pool, retries=1, retry_delay_s=0)
        no_ocr: list[float] = []
        with_ocr: list[float] = []
        for d in drivers:
            perceiver.perceive(d, with_ocr=True)  # warm the engine once
            no_ocr += _time(partial(perceiver.perceive, d, with_ocr=False), repeat)
            with_ocr += _time(partial(perceiver.perceive, d, with_ocr=True), repeat)
        results["perception_without_ocr"] = _ms(no_ocr)
        results["perception_with_ocr"] = _ms(with_ocr)

        with tempfile.TemporaryDirectory() as tmp:
            store = TimelineStore(Path(tmp) / "t.sqlite3", Path(tmp) / "artifacts")
            store.start_task("bench", 1, "bench", "bench-0")
            counter = iter(range(10**9))

            def record() -> None:
                i = next(counter)
                png = pngs[i % len(pngs)]
                before = store.save_screenshot("bench", 1, f"s{i}-before.png", png)
                after = store.save_screenshot("bench", 1, f"s{i}-after.png", png)
                store.append_step(
                    TimelineRecord(
                        "bench",
                        1,
                        i,
                        user_prompt="x" * 6000,
                        before_screenshot_path=before,
                        after_screenshot_path=after,
                        ocr=[{"text": "t", "bounds": [0, 0, 1, 1], "confidence": 90.0}] * 30,
                    )
                )

            results["recording"] = _ms(_time(record, repeat * len(screens)))
            store.close()

            outbox = OutboxStore(Path(tmp) / "outbox.sqlite3")
            shipments = Shipments(outbox, "direct")
            decision = _decision()
            outcome = types_pb2.ActionOutcome(executed=True, driver_output='{"point": [1, 2]}')

            def ship() -> None:
                i = next(counter)
                png = pngs[i % len(pngs)]
                ref = shipments.decision("bench", 1, "lease", decision, str)
                assert ref is not None
                shipments.screenshot(ref, "before", png)
                shipments.outcome(ref, decision, str, outcome)
                shipments.screenshot(ref, "after", png)

            results["outbox_writes"] = _ms(_time(ship, repeat * len(screens)))
            outbox.close()
            rec, out = results["recording"], results["outbox_writes"]
            assert isinstance(rec, dict) and isinstance(out, dict)
            results["outbox_vs_recording"] = round(out["median_ms"] / rec["median_ms"], 2)

        reused = [t for png in pngs for t in _time(partial(pool.read, png), repeat)]
        results["ocr_reused_engine"] = _ms(reused)
    finally:
        pool.close()

    tessdata = default_tessdata_path()

    def fresh_engine(png: bytes) -> None:
        engine = OcrEngine(tessdata)
        try:
            engine.read(png)
        finally:
            engine.close()

    fresh = [t for png in pngs for t in _time(partial(fresh_engine, png), repeat)]
    results["ocr_fresh_engine_per_image"] = _ms(fresh)

    binary = shutil.which("tesseract")
    if binary:
        with tempfile.TemporaryDirectory() as tmp:

            def subprocess_ocr(png: bytes) -> None:
                path = Path(tmp) / "screen.png"
                path.write_bytes(png)
                subprocess.run(
                    [binary, str(path), "stdout", "--psm", "11", "--tessdata-dir", str(tessdata)],
                    check=True,
                    capture_output=True,
                )

            proc = [t for png in pngs for t in _time(partial(subprocess_ocr, png), repeat)]
        results["ocr_subprocess_per_image"] = _ms(proc)
        baseline_key = "ocr_subprocess_per_image"
        results["baseline"] = "one tesseract process per image (pytesseract-style)"
    else:
        baseline_key = "ocr_fresh_engine_per_image"
        results["baseline"] = (
            "no `tesseract` binary installed: the baseline is a new tesserocr engine per image "
            "(it shares the per-call model load of pytesseract's process-per-image, minus the "
            "process start, so the real pytesseract ratio would be larger)"
        )
    base = results[baseline_key]
    reuse = results["ocr_reused_engine"]
    assert isinstance(base, dict)
    assert isinstance(reuse, dict)
    results["ocr_speedup_vs_baseline"] = round(base["median_ms"] / reuse["median_ms"], 2)
    fresh_ms = results["ocr_fresh_engine_per_image"]
    assert isinstance(fresh_ms, dict)
    results["ocr_speedup_vs_fresh_engine"] = round(fresh_ms["median_ms"] / reuse["median_ms"], 2)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="small and quick (1 run on each of 2 screens)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per screen (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    results = run(1, SMOKE_SCREENS) if args.smoke else run(args.repeat)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for key, value in results.items():
        print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
