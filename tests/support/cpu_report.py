"""CPU seconds per test, fixture, file and directory: where the suite's CPU goes (CI is CPU bound
on its 2-core machine, so a shorter CI means less CPU per test, not more waiting overlapped).

Off by default. `AMC_TEST_CPU_REPORT=/tmp/cpu` makes each pytest process (each xdist worker)
write one JSON line per test phase to `/tmp/cpu.<worker>.jsonl`; `python -m
tests.support.cpu_report /tmp/cpu` sums them up.

What a line counts, as deltas over the phase (setup, call, teardown):
- `self`: the worker's own user + system CPU (`RUSAGE_SELF`);
- `children`: its reaped descendants' (`RUSAGE_CHILDREN`), so a cloud or host process a test
  starts counts in the phase that waits for its exit (usually teardown); a process still running
  (a session's shared replica, Chromium) counts when it is reaped, at the session's end;
- `postgres`: the worker's own PostgreSQL server (not its child: `pg_ctl` detaches it), read from
  /proc as the postmaster's CPU plus its reaped backends' plus its live processes'.
Fixture setups are recorded on their own lines too (`self` + `children` of the fixture function).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

import pytest

ENV = "AMC_TEST_CPU_REPORT"
_TICK = os.sysconf("SC_CLK_TCK")


def _rusage() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _postmaster(port: int) -> int | None:
    """The postmaster listening on `port`: the postgres process started with `-p <port>`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"postgres") and f"-p {port}".encode() in b" ".join(argv):
            return int(entry.name)
    return None


def _tree_cpu(root: int) -> float:
    """`root`'s CPU, its reaped children's, and its live children's (PostgreSQL backends are
    the postmaster's children and nobody else's)."""
    fields = _stat(root)
    if fields is None:
        return 0.0
    # After the ")": state is field 0, utime 11, stime 12, cutime 13, cstime 14.
    ticks = sum(int(f) for f in fields[11:15])
    try:
        kids = Path(f"/proc/{root}/task/{root}/children").read_text().split()
    except OSError:
        kids = []
    for kid in kids:
        kf = _stat(int(kid))
        if kf is not None:
            ticks += int(kf[11]) + int(kf[12])
    return ticks / _TICK


class CpuReport:
    """The pytest plugin; one per pytest process."""

    def __init__(self, path: str, worker: str) -> None:
        self._out: IO[str] = open(f"{path}.{worker}.jsonl", "a")  # noqa: SIM115 - session-long
        self._postmaster: int | None = None

    def _pg(self) -> float:
        return _tree_cpu(self._postmaster) if self._postmaster is not None else 0.0

    def _write(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def _phase(self, item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
        me, kids = _rusage()
        pg, wall = self._pg(), time.monotonic()
        try:
            return (yield)
        finally:
            me2, kids2 = _rusage()
            self._write(
                {
                    "test": item.nodeid,
                    "phase": phase,
                    "self": round(me2 - me, 4),
                    "children": round(kids2 - kids, 4),
                    "postgres": round(self._pg() - pg, 4),
                    "wall": round(time.monotonic() - wall, 4),
                    "fixtures": list(getattr(item, "fixturenames", [])),
                }
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(item, "teardown"))

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        me, kids = _rusage()
        try:
            result = yield
        finally:
            me2, kids2 = _rusage()
            self._write(
                {
                    "fixture": fixturedef.argname,
                    "scope": fixturedef.scope,
                    "self": round(me2 - me, 4),
                    "children": round(kids2 - kids, 4),
                }
            )
        if fixturedef.argname == "postgres_session" and self._postmaster is None:
            self._postmaster = _postmaster(result.port)
        return result

    def pytest_sessionfinish(self) -> None:
        me, kids = _rusage()
        self._write({"session": True, "self": me, "children": kids, "postgres": self._pg()})
        self._out.close()


def register(config: pytest.Config) -> None:
    """Install the plugin when `AMC_TEST_CPU_REPORT` names a path prefix."""
    path = os.environ.get(ENV)
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        config.pluginmanager.register(CpuReport(path, worker), "amc-cpu-report")


def _top(title: str, totals: dict[str, list[float]], n: int) -> None:
    print(f"\n== {title} (CPU-s: total = self + children + postgres; count)")
    rows = sorted(totals.items(), key=lambda kv: -sum(kv[1][:3]))[:n]
    for name, (me, kids, pg, count) in rows:
        print(f"{me + kids + pg:9.1f} {me:8.1f} {kids:8.1f} {pg:7.1f} {int(count):6d}  {name}")


def summarize(prefix: str, n: int = 40) -> None:
    """Print the biggest tests, files, directories and fixtures of the report at `prefix`."""
    per: dict[str, dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    )
    for file in sorted(Path(prefix).parent.glob(Path(prefix).name + ".*.jsonl")):
        for line in file.read_text().splitlines():
            rec = json.loads(line)
            if "session" in rec:
                print(
                    f"{file.name}: session self {rec['self']:.0f} children {rec['children']:.0f}"
                    f" postgres {rec['postgres']:.0f}"
                )
                continue
            cpu = [rec["self"], rec["children"], rec.get("postgres", 0.0)]
            if "fixture" in rec:
                keys = {"fixture setup": f"{rec['fixture']} ({rec['scope']})"}
            else:
                test = rec["test"]
                path = test.split("::", 1)[0]
                keys = {
                    "test": test.split("[", 1)[0],
                    "file": path,
                    "directory": path.rsplit("/", 1)[0],
                    "phase": rec["phase"],
                }
            for view, key in keys.items():
                row = per[view][key]
                for i, v in enumerate(cpu):
                    row[i] += v
                row[3] += 1
            if "test" in rec:
                for name in rec["fixtures"]:
                    row = per["tests using fixture"][name]
                    for i, v in enumerate(cpu):
                        row[i] += v
                    row[3] += 1 if rec["phase"] == "call" else 0
    for view in ("phase", "directory", "file", "test", "fixture setup", "tests using fixture"):
        _top(view, per[view], n)


if __name__ == "__main__":
    summarize(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
