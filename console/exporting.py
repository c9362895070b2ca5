"""`amc task export` and `amc host export`, and the operators' console's download: a run read from
the cloud (optionally completed by hosts' exports) or from this machine's host timeline, written
as one zip (`export/bundle.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from amc.v1 import decision_log_service_pb2, types_pb2
from export.bundle import bundle_bytes, read_bundle, write_file
from export.cloud_source import NO_SCREENSHOTS, ScreenshotSource, run_from_cloud
from export.merge import merge
from export.run import Run


class CloudReader(ScreenshotSource, Protocol):
    """What an export reads from the cloud (`console.gateway.cloud.CloudClient` has it): the
    task, its decisions, and its steps' screenshots from the cloud's artifact store."""

    async def get_task(self, task_id: str) -> types_pb2.Task: ...

    async def decision_log(
        self, task_id: str, *, include_observation: bool = False, limit: int | None = ...
    ) -> tuple[
        list[types_pb2.Decision],
        list[decision_log_service_pb2.FailedCalls],
        decision_log_service_pb2.PrunedRecord | None,
    ]: ...


class ExportError(Exception):
    """An export that cannot be made, in one line for the person who asked."""


def export_name(task_id: str) -> str:
    """The file name an export gets unless told otherwise."""
    return f"amc-export-{task_id}.zip"


def write_export(run: Run, output: Path | None) -> Path:
    """Write `run` where `-o` says: a file, or an existing folder to put the default name in.

    `-o exports/` is how a person files several exports away; writing the zip over the folder
    failed as an unexpected error (exit 70). A folder that is not there, or a file that cannot
    be written, is an `ExportError` (one line, exit 2) rather than a traceback-worthy bug.
    """
    path = output or Path(export_name(run.task_id))
    if path.is_dir():
        path = path / export_name(run.task_id)
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: no folder {path.parent} (create it first)")
    data = bundle_bytes(run)  # its errors are not the path's: they propagate as they are
    try:
        return write_file(data, path)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None


async def cloud_run(
    cloud: CloudReader, task_id: str, screenshots: ScreenshotSource = NO_SCREENSHOTS
) -> Run:
    """The task as the cloud knows it (gRPC errors propagate: NOT_FOUND for an unknown task).
    Every decision, however many: the console's views stop at `MAX_DECISIONS`, but an export
    is the record, and one cut there said nothing of the steps it left out."""
    task = await cloud.get_task(task_id)
    decisions, failed, pruned = await cloud.decision_log(
        task.task_id, include_observation=True, limit=None
    )
    return await run_from_cloud(task, decisions, screenshots, failed, pruned)


async def export_task(
    cloud: CloudReader, task_id: str, output: Path | None, merges: Sequence[Path] = ()
) -> tuple[Path, Run]:
    """Write the cloud's export of `task_id`, with each host export in `merges` merged in."""
    hosts = []
    for path in merges:
        try:
            hosts.append(read_bundle(path))
        except ValueError as exc:
            raise ExportError(f"{path}: {exc}") from None
    run = await cloud_run(cloud, task_id, cloud)
    if hosts:
        try:
            run = merge(run, *hosts)
        except ValueError as exc:
            raise ExportError(str(exc)) from None
    return write_export(run, output), run


def export_host_task(
    db_path: Path, artifact_dir: Path, host_id: str, task_id: str, output: Path | None
) -> tuple[Path, Run]:
    """Write this host's export of `task_id` from its timeline (the host may be running)."""
    from host.timeline.export_source import run_from_timeline
    from host.timeline.store import TimelineStore

    if not db_path.is_file():
        raise ExportError(
            f"no host timeline at {db_path} (set AMC_HOST_DATA_DIR or AMC_HOST_DB_PATH to the "
            "host's)"
        )
    store = TimelineStore(db_path, artifact_dir)
    try:
        run = run_from_timeline(store, task_id, host_id)
    finally:
        store.close()
    if run is None:
        raise ExportError(f"task {task_id} is not in this host's timeline ({db_path})")
    return write_export(run, output), run
