"""A benchmark's own command line (`python -m bench.NAME`): what every one of them takes and does.

The runner (`python -m bench`) calls each benchmark's `run` itself; these are for running one
alone, at other sizes than the runner's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bench import resources
from bench.report import Section


def parser(doc: str | None) -> argparse.ArgumentParser:
    """`--smoke` (the sizes CI runs), described by the first line of the module's docstring;
    each benchmark adds its own sizes."""
    made = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else "")
    made.add_argument("--smoke", action="store_true")
    return made


def print_figures(run: Callable[[], Section]) -> int:
    """Run and print the figures; the servers the run shared (`bench.resources`: PostgreSQL,
    certificates) are stopped even when it failed, as the runner stops them."""
    try:
        print(run().text())
    finally:
        resources.close()
    return 0
