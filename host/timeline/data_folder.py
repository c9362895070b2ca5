"""Whether this host can write its data folders, kept while it cannot, and the probe that ends it.

An attempt that meets a full (read-only, failing) data folder ends retryable
(`host.timeline.storage_faults`). A host that went on taking work then failed every task sent
to it within milliseconds (its timeline row could not be written), and the cloud, requeueing
each at once, handed it straight back: a task's 10 attempts were gone before anyone could free
a byte. Once a write there fails the host keeps all its phones out of work (the cloud hears
them OFFLINE, an assignment already on its way is refused,
`ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE`) and tries a write of its own every `probe_s`; the
first that succeeds puts it back to work.

The host writes into up to three folders (the timeline's, the screenshots', the outbox's:
`host.settings`), which may be on different disks. The probe writes into every one of them:
a probe of the timeline's folder alone put a host whose screenshot disk was full back to work,
to fail its next attempt at its first screenshot, one attempt burned per probe. It also opens
for append each file a refused write named (a database the host keeps open: the timeline, the
outbox, the sessions): one file that lost its write permission in a writable folder let the
probe's new file through, and the host flapped between paused and working.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

#: What a probe writes: more than a timeline row and its journal, about a step's screenshot, so
#: a folder that takes it takes the next step too (a few bytes fit in a disk that is "full").
PROBE_BYTES = 256 * 1024
PROBE_NAME = ".amc-write-probe"


class DataFolder:
    """The data folders' state: "" while writes work, else the words an operator reads.

    Marked from the event loop (an attempt's end) and from the stores' writing threads; probed
    in a worker thread: hence the lock."""

    def __init__(
        self,
        folder: Path,
        probe_s: float,
        clock: Callable[[], float] = time.monotonic,
        others: Sequence[Path] = (),
        name: str = "",
    ) -> None:
        #: The timeline's folder (`AMC_HOST_DATA_DIR`), then the other folders the host
        #: writes into (screenshots, outbox), each once.
        self.folders = list(dict.fromkeys(f.absolute() for f in (folder, *others)))
        self.probe_s = probe_s
        #: Who this host is until the cloud's welcome says (its configured id, else what its
        #: certificate names): a pause before the first welcome named no host ("this host").
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._why = ""
        #: Writes refused so far (`failed`): a probe clears the mark only if none was refused
        #: while it ran.
        self._faults = 0
        self._probed_at = 0.0
        self._owed: list[Callable[[], object]] = []
        #: Paths a refused write named (`failed`): each that is a file is opened for append by
        #: every probe.
        self._files: dict[Path, None] = {}

    @property
    def folder(self) -> Path:
        """The timeline's folder."""
        return self.folders[0]

    @property
    def unwritable(self) -> str:
        """Why the host takes no work ("" when it does)."""
        with self._lock:
            return self._why

    def failed(self, host_id: str, reason: str, where: Path | None = None) -> str:
        """A write failed (`reason`: what the disk said; `where`: the file or folder it wrote,
        when known; `host_id`: as the cloud's welcome said, "" before it). The words, when
        this made the host stop taking work; "" when it already had."""
        folder = self.holding(where) if where is not None else None
        with self._lock:
            self._faults += 1
            if where is not None:
                # Whether it is a file the probe finds, in its thread (`_reopen`): asked here,
                # the stat of a disk that hangs stopped the caller, the event loop at an
                # attempt's end, with every lease it renews.
                self._files[where.absolute()] = None
            if folder is not None and folder not in self.folders:
                # Probed too, until the host stops: also when the host is already paused, or a
                # folder outside the configured ones (the sessions file's) was never probed.
                self.folders.append(folder)
            if self._why:
                return ""
            named = str(folder) if folder is not None else ", ".join(map(str, self.folders))
            known = host_id or self.name
            who = f"host {known}" if known else "this host"
            self._why = (
                f"{who} cannot write its data folder {named} ({reason}); it takes no work "
                f"until a write there succeeds, which it tries every {self.probe_s:g} s: free "
                "space or fix the folder (AMC_HOST_DATA_DIR, AMC_HOST_ARTIFACT_DIR, "
                "AMC_HOST_OUTBOX_PATH)"
            )
            self._probed_at = self._clock()
            return self._why

    def holding(self, where: Path) -> Path:
        """The folder of this host's that holds `where` (the deepest, as the screenshots'
        folder may be inside the timeline's), else `where`'s own folder."""
        where = where.absolute()
        holders = [f for f in self.folders if where == f or where.is_relative_to(f)]
        return max(holders, key=lambda f: len(f.parts)) if holders else where.parent

    def owe(self, write: Callable[[], object]) -> None:
        """A write the disk refused that must be made before the host takes work again (a
        start's own: attempts a dead process left "running" marked interrupted, which a new
        attempt must not be taken for): made by the probe after its own writes, in its
        thread; while it fails the host stays paused."""
        with self._lock:
            self._owed.append(write)

    def due(self) -> bool:
        """Unwritable, and the last probe (or the mark) is `probe_s` old."""
        with self._lock:
            return bool(self._why) and self._clock() - self._probed_at >= self.probe_s

    def probe(self) -> bool:
        """Write, sync and delete a file of `PROBE_BYTES` in every folder, open for append each
        file a refused write named, then make the writes owed (blocking); True when that
        cleared the mark, False when a write was refused (`failed`) while it ran. A folder
        that refuses raises the disk's OSError, naming the probe's file there; a file, naming
        it; an owed write, its own error."""
        with self._lock:
            self._probed_at = self._clock()
            folders = list(self.folders)
            files = list(self._files)
            faults = self._faults
        for folder in folders:
            _probe(folder / PROBE_NAME)
        for file in files:
            _reopen(file)
        with self._lock:
            owed = list(self._owed)
        for write in owed:  # one that fails raises what the disk said
            write()
            with self._lock:
                self._owed.remove(write)
        with self._lock:
            if self._faults != faults:
                # A write failed while this probe ran (a store's thread told it): the disk may
                # have failed after the probe's own writes, so the mark stands for the next.
                return False
            cleared, self._why = bool(self._why), ""
        return cleared


def _probe(probe: Path) -> None:
    try:
        with probe.open("wb") as out:
            out.write(b"\0" * PROBE_BYTES)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(probe)) from exc  # which folder refused
    finally:
        probe.unlink(missing_ok=True)


def _reopen(file: Path) -> None:
    """Open `file` for append and close it, writing nothing: refused (its mode, owner or
    attributes changed), raises the OSError naming it. One gone since is no refusal, nor is a
    folder a refused write named (the folder is probed)."""
    if not file.is_file():
        return
    with contextlib.suppress(FileNotFoundError):
        os.close(os.open(file, os.O_WRONLY | os.O_APPEND))
