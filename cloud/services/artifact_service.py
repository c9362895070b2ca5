"""ArtifactService: hosts upload step screenshots, operators list and read them.

The bytes go to the artifact store (`cloud.artifacts`), a row of metadata to the database
(`cloud.store.screenshots`). Uploads are checked at the boundary (size, declared type against
the image's real format, ids) before anything is stored, and only the host that holds or lately
held the attempt's lease may upload for it (`shipping.check_lease`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import logging
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
from PIL import Image

from amc.v1 import artifact_service_pb2 as pb
from amc.v1 import artifact_service_pb2_grpc, types_pb2
from cloud import authz
from cloud.artifacts import ArtifactStore, ArtifactStoreUnavailable, object_key
from cloud.lease.validate import MAX_ID
from cloud.services.attempts import known_step_page
from cloud.services.shipping import HOST_DECISION_ID, check_lease, lease_ref_problem
from cloud.services.status import abort
from cloud.settings import CloudSettings
from cloud.store import convert, screenshots
from cloud.store.database import Store
from cloud.store.models import StepScreenshotRow
from planner.image_read import IMAGE_ERRORS, UnreadableImage, open_image, size_problem

MAX_SCREENSHOT_BYTES = 8 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024
MAX_COORDINATE = 100_000
_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG"}
PHASES: dict[int, str] = {
    pb.SCREENSHOT_PHASE_BEFORE: "before",
    pb.SCREENSHOT_PHASE_AFTER: "after",
}
_PHASE_VALUES = {name: value for value, name in PHASES.items()}
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = logging.getLogger(__name__)


def image_size(data: bytes, content_type: str) -> tuple[int, int] | str:
    """(width, height) of an image of the declared type, or what is wrong with it (naming the
    field). The whole image is decoded (`open_image`), so a truncated or damaged one is refused
    here rather than breaking every export of its task later; one over the size cap is refused
    on its header, before anything is decoded."""
    try:
        with Image.open(io.BytesIO(data)) as header:
            found, size = header.format, header.size
    except IMAGE_ERRORS as exc:
        return f"data: not a readable image ({type(exc).__name__}: {exc})"
    if found != _FORMATS[content_type]:
        return f"content_type: {content_type} but the data is {found or 'unknown'}"
    too_big = size_problem(size)
    if too_big:
        return f"data: {too_big}"
    try:
        open_image(data).close()
    except UnreadableImage as exc:
        return f"data: not a readable image ({exc})"
    return size


def upload_problem(request: pb.UploadStepScreenshotRequest) -> str | None:
    """INVALID_ARGUMENT text for the request's shape (before the image itself), or None."""
    problem = lease_ref_problem("", request.task_id, request.attempt, request.lease_id)
    if problem:
        return problem
    step = request.WhichOneof("step")
    if step is None:
        return "decision_id: one of decision_id and host_decision_id is required"
    if step == "decision_id" and not 0 < len(request.decision_id) <= MAX_ID:
        return f"decision_id: 1 to {MAX_ID} characters"
    if step == "host_decision_id" and not HOST_DECISION_ID.fullmatch(request.host_decision_id):
        return "host_decision_id: 1 to 64 characters of A-Z a-z 0-9 _ -"
    if request.phase not in PHASES:
        return "phase: SCREENSHOT_PHASE_BEFORE or SCREENSHOT_PHASE_AFTER"
    if request.content_type not in _FORMATS:
        return f"content_type: image/png or image/jpeg, not {request.content_type[:64]!r}"
    if not request.data:
        return "data: empty"
    if len(request.data) > MAX_SCREENSHOT_BYTES:
        return f"data: {len(request.data)} bytes; at most {MAX_SCREENSHOT_BYTES}"
    t = request.marks.target
    if any(abs(v) > MAX_COORDINATE for v in (t.left, t.top, t.right, t.bottom)):
        return f"marks.target: coordinates must be within -{MAX_COORDINATE}..{MAX_COORDINATE}"
    return None


def screenshot_message(row: StepScreenshotRow) -> pb.StepScreenshot:
    """A metadata row as the protocol's StepScreenshot."""
    out = pb.StepScreenshot(
        task_id=row.task_id,
        attempt=row.attempt,
        step_index=row.step_index,
        decision_id=row.decision_id,
        phase=_PHASE_VALUES[row.phase],  # type: ignore[arg-type]
        content_type=row.content_type,
        size_bytes=row.size_bytes,
        width=row.width,
        height=row.height,
        host_id=row.host_id,
        uploaded_at=convert.ts(row.uploaded_at),
    )
    if row.target_left is not None:
        out.marks.target.CopyFrom(
            types_pb2.Rect(
                left=row.target_left,
                top=row.target_top or 0,
                right=row.target_right or 0,
                bottom=row.target_bottom or 0,
            )
        )
    return out


class ArtifactServicer(artifact_service_pb2_grpc.ArtifactServiceServicer):
    """Upload (hosts), list and read (operators) step screenshots."""

    def __init__(self, store: Store, artifacts: ArtifactStore, settings: CloudSettings) -> None:
        self._store = store
        self._artifacts = artifacts
        self._window = dt.timedelta(seconds=settings.ship_window_seconds)

    async def UploadStepScreenshot(
        self, request: pb.UploadStepScreenshotRequest, context: Context
    ) -> pb.UploadStepScreenshotResponse:
        problem = upload_problem(request)
        if problem:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
        size = await asyncio.to_thread(image_size, request.data, request.content_type)
        if isinstance(size, str):
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, size)
        host_id = authz.caller().name
        await check_lease(
            context,
            self._store,
            self._window,
            host_id,
            request.task_id,
            request.attempt,
            request.lease_id,
        )
        step = await screenshots.step_of(
            self._store,
            request.task_id,
            request.attempt,
            decision_id=request.decision_id,
            host_id=host_id,
            host_decision_id=request.host_decision_id,
        )
        if step is None:
            named = request.decision_id or request.host_decision_id
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{request.WhichOneof('step')}: {named!r} names no logged decision of task "
                f"{request.task_id!r} attempt {request.attempt} (ship the decision first)",
            )
        phase = PHASES[request.phase]
        key = object_key(
            request.task_id, request.attempt, step.step_index, phase, request.content_type
        )
        replaced = await screenshots.get(
            self._store, request.task_id, request.attempt, step.step_index, phase
        )
        try:
            await self._artifacts.put(key, request.data, request.content_type)
        except ArtifactStoreUnavailable as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"artifact store: {exc}")
        target = request.marks.target if request.marks.HasField("target") else None
        row = StepScreenshotRow(
            task_id=request.task_id,
            attempt=request.attempt,
            step_index=step.step_index,
            phase=phase,
            decision_id=step.decision_id,
            host_id=host_id,
            object_key=key,
            content_type=request.content_type,
            size_bytes=len(request.data),
            width=size[0],
            height=size[1],
            target_left=target.left if target else None,
            target_top=target.top if target else None,
            target_right=target.right if target else None,
            target_bottom=target.bottom if target else None,
            uploaded_at=self._store.now(),
        )
        await screenshots.record(self._store, row)
        if replaced is not None and replaced.object_key != key:
            # The key ends in the format: the one replaced is another object, which no row
            # names any more. Deleted now; should that fail, the retention pass deletes it
            # with the row's (`every_format`).
            try:
                await self._artifacts.delete([replaced.object_key])
            except ArtifactStoreUnavailable as exc:
                log.warning(
                    "the replaced screenshot %s stays in the store until its task's retention "
                    "pass: %s",
                    replaced.object_key,
                    exc,
                )
        return pb.UploadStepScreenshotResponse(screenshot=screenshot_message(row))

    async def ListStepScreenshots(
        self, request: pb.ListStepScreenshotsRequest, context: Context
    ) -> pb.ListStepScreenshotsResponse:
        await known_step_page(context, self._store, request, 1000)
        try:
            rows, token = await screenshots.list_page(
                self._store,
                request.task_id,
                request.attempt,
                request.page_size or 200,
                request.page_token,
                request.after_step,
            )
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        return pb.ListStepScreenshotsResponse(
            screenshots=[screenshot_message(r) for r in rows], next_page_token=token
        )

    async def GetStepScreenshot(
        self, request: pb.GetStepScreenshotRequest, context: Context
    ) -> AsyncIterator[pb.GetStepScreenshotResponse]:
        if not request.task_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "task_id: required")
        if request.attempt < 1:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "attempt: 1 or more")
        if request.step_index < 1:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "step_index: 1 or more")
        if request.phase not in PHASES:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "phase: SCREENSHOT_PHASE_BEFORE or SCREENSHOT_PHASE_AFTER",
            )
        phase = PHASES[request.phase]
        what = f"step {request.step_index} of task {request.task_id!r} attempt {request.attempt}"
        row = await screenshots.get(
            self._store, request.task_id[:MAX_ID], request.attempt, request.step_index, phase
        )
        if row is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"{what} has no {phase} screenshot")
        try:
            data = await self._artifacts.get(row.object_key)
        except ArtifactStoreUnavailable as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"artifact store: {exc}")
        if data is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"the {phase} screenshot of {what} is gone from the artifact store",
            )
        meta = screenshot_message(row)
        for start in range(0, max(len(data), 1), CHUNK_BYTES):
            chunk = pb.GetStepScreenshotResponse(data=data[start : start + CHUNK_BYTES])
            if start == 0:
                chunk.screenshot.CopyFrom(meta)
            yield chunk
