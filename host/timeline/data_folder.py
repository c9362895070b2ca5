"""Whether this host can write its data folder, kept while it cannot, and the probe that ends it.

An attempt that meets a full (read-only, failing) data folder ends retryable
(`host.timeline.storage_faults`). A host that went on taking work then failed every task sent
to it within milliseconds (its timeline row could not be written), and the cloud, requeueing
each at once, handed it straight back: a task's 10 attempts were gone before anyone could free
a byte. Once a write there fails the host keeps all its phones out of work (the cloud hears
them OFFLINE, an assignment already on its way is refused,
`ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE`) and tries a write of its own every `probe_s`; the
first that succeeds puts it back to work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: What a probe writes: more than a timeline row and its journal, about a step's screenshot, so
#: a folder that takes it takes the next step too (a few bytes fit in a disk that is "full").
PROBE_BYTES = 256 * 1024
PROBE_NAME = ".amc-write-probe"


class DataFolder:
    """The data folder's state: "" while writes work, else the words an operator reads.

    Marked from the event loop (an attempt's end); probed in a worker thread: hence the lock."""

    def __init__(
        self, folder: Path, probe_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.folder = folder
        self.probe_s = probe_s
        self._clock = clock
        self._lock = threading.Lock()
        self._why = ""
        self._probed_at = 0.0

    @property
    def unwritable(self) -> str:
        """Why the host takes no work ("" when it does)."""
        with self._lock:
            return self._why

    def failed(self, host_id: str, reason: str) -> str:
        """A write there failed (`reason`: what the disk said). The words, when this made the
        folder unwritable; "" when it already was."""
        with self._lock:
            if self._why:
                return ""
            self._why = (
                f"host {host_id} cannot write its data folder {self.folder} ({reason}); it "
                f"takes no work until a write there succeeds, which it tries every "
                f"{self.probe_s:g} s: free space or fix the folder (AMC_HOST_DATA_DIR)"
            )
            self._probed_at = self._clock()
            return self._why

    def due(self) -> bool:
        """Unwritable, and the last probe (or the mark) is `probe_s` old."""
        with self._lock:
            return bool(self._why) and self._clock() - self._probed_at >= self.probe_s

    def probe(self) -> bool:
        """Write, sync and delete a file of `PROBE_BYTES` there (blocking); True when that
        cleared the mark. A failed probe raises the disk's OSError."""
        with self._lock:
            self._probed_at = self._clock()
        probe = self.folder / PROBE_NAME
        try:
            with probe.open("wb") as out:
                out.write(b"\0" * PROBE_BYTES)
                out.flush()
                os.fsync(out.fileno())
        finally:
            probe.unlink(missing_ok=True)
        with self._lock:
            cleared, self._why = bool(self._why), ""
        return cleared
