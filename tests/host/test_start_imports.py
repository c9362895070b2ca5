"""What a host loads to start: `amc host run` on the cloud planner transport (the default) never
plans in its own process, so it starts without the planner engine and the model providers' SDKs,
without the local console's web stack and without uiautomator2 (not the default driver); with
OCR off, without Tesseract.

Every fault, e2e and node test starts such hosts as processes, and on a loaded machine each
of these imports cost a second or more of every start. The host here is the real command (its
settings, virtual phones, data folder, assembly and start-up banner); only the step after the
banner, serving until stopped, is replaced by a probe that prints what the process has loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.processes import _clean_env, free_port, make_pki

#: Loaded only by what uses them: the direct transport's planning, `--console`, the u2 driver,
#: OCR (off here, as in every virtual-phone test).
HEAVY = (
    "anthropic",
    "openai",
    "google.genai",
    "planner.plan_step",
    "planner.planner",
    "planner.vendors",
    "fastapi",
    "uvicorn",
    "jinja2",
    "uiautomator2",
    "tesserocr",
)

#: `amc host run` itself (console.cli:main), up to where the host would serve.
PROBE = f"""
import json, sys
import host.runner

async def loaded(app, stop):
    print("LOADED " + json.dumps([m for m in {HEAVY!r} if m in sys.modules]), flush=True)

host.runner.serve_host = loaded
sys.argv = ["amc", "host", "run"]
from console.cli import main
main()
"""


def _loaded_at_start(tmp_path: Path, transport: str) -> list[str]:
    pki = make_pki(tmp_path / "pki", ["lab-1"])
    env = {
        **_clean_env(),
        "AMC_HOST_DEVICE_SOURCE": "virtual",
        "AMC_HOST_OCR_ENABLED": "false",
        "AMC_HOST_DATA_DIR": str(tmp_path / "data"),
        "AMC_HOST_CLOUD_ADDRESS": f"127.0.0.1:{free_port()}",  # no cloud: the banner comes first
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_HOST_ID": "lab-1",
        "AMC_HOST_METRICS_ADDRESS": "off",
        "AMC_PLANNER_PROVIDER": "offline",
        "AMC_HOST_PLANNER_TRANSPORT": transport,
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr)
    loaded: list[str] = json.loads(lines[0].removeprefix("LOADED "))
    return loaded


def test_a_cloud_transport_host_starts_without_the_planner_engine_console_or_u2(
    tmp_path: Path,
) -> None:
    assert _loaded_at_start(tmp_path, "cloud") == []


def test_a_direct_transport_host_loads_the_planner_engine_it_plans_with(tmp_path: Path) -> None:
    """The probe sees what the start loads on its way: the direct transport's planner is built
    at start, so the engine is there (and the console's web stack still is not)."""
    loaded = _loaded_at_start(tmp_path, "direct")
    assert "planner.planner" in loaded
    assert not {"fastapi", "uvicorn", "uiautomator2", "anthropic", "openai"} & set(loaded)
