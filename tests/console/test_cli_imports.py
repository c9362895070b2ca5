"""What an `amc` command against a cloud loads: `amc task list` needs no settings class, so it
runs without `cloud.settings` and pydantic-settings (~90 ms of every such process; the CLI
named only the default cloud address from there, now in `cloud.default_address`).

The command is the real one (console.cli:main, its options, its mTLS channel) against the
session's real cloud; once it has run, the probe prints what the process loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.console.console_stack import Cloud
from tests.support.processes import _clean_env

#: Loaded only by what runs a part (`amc cloud serve`, `amc host run`) or reads its settings.
HEAVY = ("cloud.settings", "pydantic_settings")

PROBE = """
import json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["amc", *json.loads(sys.argv[1])]
from console.cli import main
try:
    main()
finally:
    print("LOADED " + json.dumps([m for m in heavy if m in sys.modules]))
"""


def test_a_task_list_runs_without_the_settings_classes(cloud: Cloud) -> None:
    args = ["--cloud", cloud.address, "--pki-dir", str(cloud.pki), "--operator", "tester"]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([*args, "task", "list"]), json.dumps(HEAVY)],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr)
    assert json.loads(lines[0].removeprefix("LOADED ")) == []
