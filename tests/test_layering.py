"""Which top-level packages may import which.

The host runs on machines that are not the operators' (it must not load the operators' console
and its gateway); the cloud serves hosts and operators alike; the planner is a library both
use; `webui` is the shared web toolkit of both consoles; the lease store answers in its own
types and leaves the protocol's messages to the lease service. Two checks: every import
statement in the source (also the ones inside functions), and what importing every host module
really loads. A third keeps the provider SDKs out of every process's start.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: folder -> the top-level packages nothing under it may import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "host": frozenset({"console"}),
    "cloud": frozenset({"host", "console", "webui", "export"}),
    "planner": frozenset({"cloud", "host", "console", "webui", "export"}),
    "webui": frozenset({"cloud", "host", "console", "planner", "export"}),
    # Exports are made from a neutral record both sides fill (docs/decisions/0040).
    "export": frozenset({"cloud", "host", "console", "webui"}),
    "telemetry": frozenset({"cloud", "host", "console", "planner", "webui", "export", "amc"}),
    "cloud/store/leases": frozenset({"amc", "grpc", "google"}),
}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`; relative imports stay inside
    their package, so they are not listed."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def violations(folder: str) -> list[str]:
    """`file:line imports module` for every forbidden import under `folder`."""
    out: list[str] = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in imported_modules(path.read_text(encoding="utf-8")):
            if module.split(".", 1)[0] in FORBIDDEN[folder]:
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return out


def test_the_checker_sees_imports_inside_functions() -> None:
    source = "import os\ndef f() -> None:\n    from console.gateway import auth\n"
    assert imported_modules(source) == [(1, "os"), (3, "console.gateway")]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_forbidden_imports(folder: str) -> None:
    assert violations(folder) == []


def test_loading_every_host_module_loads_no_console() -> None:
    """Imports that happen indirectly (through a third package) show here, not in the source."""
    script = (
        "import importlib, pkgutil, sys\n"
        "import host\n"
        "for info in pkgutil.walk_packages(host.__path__, 'host.'):\n"
        "    importlib.import_module(info.name)\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] == 'console')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == []


@pytest.mark.parametrize("module", ["cloud.startup", "host.runner", "console.embedded"])
def test_a_process_start_loads_no_provider_sdk(module: str) -> None:
    """The two SDKs cost about 2.7 s of CPU to import: a cloud or host whose planner is offline
    (or on the other transport) must not pay it at every start. They load when a provider's
    client is built."""
    script = (
        f"import sys, {module}\n"
        "print('\\n'.join(m for m in ('anthropic', 'openai') if m in sys.modules))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == []
