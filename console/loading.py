"""Ctrl-C while `amc` is still loading exits 130 quietly, as it does once the command runs.

Loading the command line takes a few tenths of a second (typer, rich, grpc, the generated
protobuf modules), all before `cli_errors.run_main` can catch a KeyboardInterrupt: Python
printed a traceback and the process died of SIGINT (exit -2 to a script). `console.cli` imports
this module before anything else and calls `finished()` once loaded, which hands Ctrl-C back to
Python (KeyboardInterrupt, which `asyncio.run` and `run_main` rely on). Only the interpreter's
own start-up, before this module, is left as it was.
"""

from __future__ import annotations

import contextlib
import signal
from types import FrameType


def _exit_interrupted(signum: int, frame: FrameType | None) -> None:
    # Imported only now: `console.exit_codes` loads `typing` (~10 ms) that this module goes before.
    from console.exit_codes import INTERRUPTED

    raise SystemExit(INTERRUPTED)


# Only over Python's own handler: an ignored SIGINT (a job started in the background) stays
# ignored, and a program that imports the command line with a handler of its own keeps it.
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    with contextlib.suppress(ValueError):  # imported off the main thread: not ours to change
        signal.signal(signal.SIGINT, _exit_interrupted)


def finished() -> None:
    """Ctrl-C is a KeyboardInterrupt again, now that the command line is loaded."""
    if signal.getsignal(signal.SIGINT) is _exit_interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
