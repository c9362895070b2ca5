"""Run adbutils' and uiautomator2's own device test suites against the virtual phone.

    .venv/bin/python scripts/peer_suites.py --adbutils /tmp/peers/adbutils \
        --uiautomator2 /tmp/peers/uiautomator2

Each path is a checkout of the peer's public repository (github.com/openatx/adbutils,
github.com/openatx/uiautomator2) kept outside this repository: their tests are run from there,
never copied here. The tests run with the libraries installed in this venv (the versions amc
uses), against one virtual phone served by `ThreadedAdbServer`.

Their suites talk to the adb server at 127.0.0.1:5037 (some tests hard-code it), so the script
re-runs itself in a private network namespace (`unshare -rn`: a loopback of its own) and
serves the virtual phone on port 5037 there, leaving the machine's port 5037 alone.

Tests that need an app no phone here has (uiautomator2's demo app `com.example.u2testdemo`
behind the `app` fixture, the ApiDemos app `io.appium.android.apis` behind `dev`) are reported as
"needs a demo app", not run. Prints a summary per suite and
each failure's first line; exits 0 (the numbers are the result, see docs/virtual-phone.md).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_NETNS_MARK = "AMC_PEER_SUITES_NETNS"
_ADB_PORT = 5037
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

# A pytest plugin (written to a temporary directory and loaded with -p) that leaves out the
# tests needing one of uiautomator2's demo apps: no phone here has them installed.
_PLUGIN = """
import pytest

DEMO_APPS = {"app": "com.example.u2testdemo", "dev": "io.appium.android.apis"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = getattr(item, "fixturenames", ())
        needs = [pkg for fixture, pkg in DEMO_APPS.items() if fixture in names]
        if getattr(item.module, "PACKAGE", "") in DEMO_APPS.values():
            needs.append(item.module.PACKAGE)
        if needs:
            item.add_marker(pytest.mark.skip(reason="needs a demo app: " + needs[0]))
"""

# Each suite's device-test folders, one pytest run each (their conftests and some module
# names collide between folders).
SUITES = {
    "adbutils": ["e2etests"],
    "uiautomator2": ["demo_tests", "mobile_tests"],
}


def _loopback_up() -> None:
    """Bring `lo` up in the fresh network namespace (what `ip link set lo up` does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _summary(junit: Path) -> tuple[dict[str, int], list[str]]:
    counts = {"passed": 0, "failed": 0, "skipped_demo_app": 0, "skipped_by_suite": 0}
    failures: list[str] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        failed = case.find("failure")
        if failed is None:
            failed = case.find("error")
        skipped = case.find("skipped")
        if failed is not None:
            counts["failed"] += 1
            message = (failed.get("message") or failed.text or "").strip().splitlines()
            failures.append(f"{name}: {message[0][:200] if message else ''}")
        elif skipped is not None:
            reason = skipped.get("message") or ""
            key = "skipped_demo_app" if "needs a demo app" in reason else "skipped_by_suite"
            counts[key] += 1
        else:
            counts["passed"] += 1
    return counts, failures


def _run_suite(name: str, checkout: Path, plugin_dir: Path) -> None:
    total = {"passed": 0, "failed": 0, "skipped_demo_app": 0, "skipped_by_suite": 0}
    failures: list[str] = []
    for folder in SUITES[name]:
        counts, failed = _run_folder(folder, checkout, plugin_dir)
        total = {k: total[k] + counts[k] for k in total}
        failures += failed
    run = total["passed"] + total["failed"]
    print(f"\n== {name} ({checkout}): {total['passed']} of {run} passed; {total}")
    for line in failures:
        print(f"   FAILED {line}")


def _run_folder(folder: str, checkout: Path, plugin_dir: Path) -> tuple[dict[str, int], list[str]]:
    junit = plugin_dir / f"{folder}.xml"
    env = dict(
        os.environ,
        ANDROID_ADB_SERVER_PORT=str(_ADB_PORT),
        PYTHONPATH=str(plugin_dir),
        HOME=str(plugin_dir),  # uiautomator2 caches its jar under ~/.uiautomator2
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        folder,
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "amc_peer_plugin",
        "--rootdir",
        str(checkout),
        "-o",
        "addopts=",
        f"--junitxml={junit}",
    ]
    # `python -m pytest` would put the checkout itself on sys.path and test the checkout's
    # library instead of the installed one: run from its test folder's parent with -P.
    subprocess.run([cmd[0], "-P", *cmd[1:]], cwd=checkout, env=env, check=False, stdout=sys.stderr)
    return _summary(junit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adbutils", type=Path, help="checkout of openatx/adbutils")
    parser.add_argument("--uiautomator2", type=Path, help="checkout of openatx/uiautomator2")
    args = parser.parse_args()
    chosen = {k: v for k, v in (("adbutils", args.adbutils), ("uiautomator2", args.uiautomator2))}
    chosen = {k: v.resolve() for k, v in chosen.items() if v is not None}
    if not chosen:
        parser.error("give at least one checkout (--adbutils PATH, --uiautomator2 PATH)")
    if os.environ.get(_NETNS_MARK) != "1":
        env = dict(os.environ, **{_NETNS_MARK: "1"})
        return subprocess.run(
            ["unshare", "-rn", sys.executable, __file__, *sys.argv[1:]], env=env, check=False
        ).returncode
    _loopback_up()
    sys.path.insert(0, str(REPO))
    from host.devices.virtual.adb_server import ThreadedAdbServer
    from host.devices.virtual.phone import VirtualPhone

    with tempfile.TemporaryDirectory(prefix="amc-peers-") as tmp:
        plugin_dir = Path(tmp)
        (plugin_dir / "amc_peer_plugin.py").write_text(_PLUGIN)
        server = ThreadedAdbServer([VirtualPhone("emulator-5554")])
        server.start("127.0.0.1", _ADB_PORT)
        try:
            for name, checkout in chosen.items():
                _run_suite(name, checkout, plugin_dir)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
