"""`run_host`: wire phones, perception, planner, timeline and the lease stream, run until told.

The integrator's `amc host run` builds a `HostSettings` and awaits `run_host(settings)`; the
embedded demo can pass its own stop event, planner and virtual adb server address. `build_host`
returns the assembled parts without starting them (the local console reads `HostApp.store`,
`HostApp.lease.running()` and `HostApp.registry.devices()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sqlite3
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from amc.v1 import types_pb2
from cloud.cert_validity import Validity
from host import metrics as host_metrics
from host.agent.live_thinking import ClearingPlanner, LiveThinking
from host.agent.loop import AgentLoop, LoopSettings, TaskOutcome, TaskSpec
from host.agent.planning_wait import CloudBack, WaitPolicy
from host.agent.progress import ProgressHolder
from host.cloud_channel import (
    ChannelOnce,
    LeaseDialer,
    check_certificate,
    expiry_warning,
    failure,
    keepalive_warning,
)
from host.devices import adb_restarts
from host.devices.adb_driver import AdbDriver
from host.devices.base import Driver
from host.devices.health import PhoneHealth, Unreadable
from host.devices.lanes import Lane, PhoneLanes
from host.devices.registry import ChangeKind, DeviceInfo, DeviceRegistry, refused_serial
from host.lease_client import LeaseClient, LeaseClientConfig
from host.outbox import Backlog, OutboxSender, OutboxStore, Shipments
from host.perception.ocr import OcrPool
from host.perception.perceive import Perceiver
from host.planner_client import CloudPlanner, DirectPlanner, StepPlanner
from host.settings import HostSettings
from host.start_disk import OpenedData, open_data, settle_last_run
from host.startup import describe
from host.timeline import start_reads
from host.timeline.data_folder import DataFolder
from host.timeline.start_reads import read_at_start
from host.timeline.storage_faults import storage_fault
from host.timeline.store import TimelineStore
from planner import model_profiles
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from telemetry import metrics_http, tracing
from telemetry.metrics_http import MetricsAddressError, MetricsServer

if TYPE_CHECKING:
    from host.console.settings import HostConsoleSettings
    from host.devices.virtual.adb_server import ThreadedAdbServer
    from planner.planner import Planner

log = logging.getLogger(__name__)

DriverFactory = Callable[[str], Driver]
#: How often the host writes which marked phones adb still lists (`_saw_marked`): a restart
#: then counts a phone absent at most this much less than the host saw it absent.
MARKS_SEEN_EVERY_S = 3600.0


@dataclass(slots=True, weakref_slot=True, eq=False)  # counted by identity (host/metrics.py)
class HostApp:
    """Everything one host process runs, assembled by `build_host`."""

    settings: HostSettings
    store: TimelineStore
    registry: DeviceRegistry
    perceiver: Perceiver
    ocr: OcrPool | None
    lease: LeaseClient
    make_driver: DriverFactory
    #: A planner given by the caller (tests, the embedded demo), used as is for every task.
    direct_planner: StepPlanner | None
    #: The cloud transport's channel for Decide (`ChannelOnce`: opened at the build, its files
    #: read off the event loop).
    planner_channel: ChannelOnce | None = None
    #: The outbox's channel (`ChannelOnce`: its sender asks for it before each batch), closed
    #: when the host stops (None: a `channel_factory` given instead).
    outbox_channel: ChannelOnce | None = None
    #: Session mode (`AMC_PLANNER_MODE=session`, direct transport): one conversation per attempt.
    session_store: SqliteSessionStore | None = None
    planner_settings: PlannerSettings | None = None
    #: Direct transport, compact mode: the planner every attempt's `DirectPlanner` shares.
    compact_engine: Planner | None = None
    #: What the model is thinking right now, per attempt (direct session mode, streaming).
    thinking: LiveThinking = field(default_factory=LiveThinking)
    #: The durable outbox (decisions of the direct transport, step screenshots, results the
    #: cloud has not answered yet) and its sender.
    outbox: OutboxStore | None = None
    outbox_sender: OutboxSender | None = None
    #: The thread the sender and the backlog report use the outbox in (`OutboxSender.use`): a
    #: daemon, as `folder_lane`, so a read hung on the disk holds no exit.
    outbox_lane: Lane = field(default_factory=lambda: Lane("", name="outbox"))
    shipments: Shipments | None = None
    #: Each phone's worker thread for its driver calls, kept across its attempts.
    lanes: PhoneLanes = field(default_factory=PhoneLanes)
    #: Said at each welcome of the lease stream: steps waiting to plan ask again at once.
    cloud_back: CloudBack = field(default_factory=CloudBack)
    #: Phones whose screen could not be read, attempt after attempt (`build_host` sets it),
    #: and the probes of them under way, by serial.
    health: PhoneHealth = field(default_factory=lambda: PhoneHealth(3, 60.0))
    probes: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    #: The write probe of a data folder that refused a write, while one is under way: a task of
    #: its own, as a phone's probe, so a disk that hangs does not stall the device poll.
    folder_probe: asyncio.Task[None] | None = None
    #: The thread the folder's probe writes in: a daemon (`Lane`), not asyncio's default
    #: pool, whose threads `asyncio.run` and Python join at exit: a write that hangs there
    #: held a stopped host's exit until it returned. One thread, so probes of a hung disk
    #: do not pile up (the next waits for the one that hangs).
    folder_lane: Lane = field(default_factory=lambda: Lane("", name="data-folder-probe"))
    #: Set when the host stops: a retention pass ends where it is instead of holding the exit
    #: for as long as deleting its files takes (minutes for many thousand screenshots).
    retention_stop: threading.Event = field(default_factory=threading.Event)
    #: The thread retention passes delete in (`_retention_pass`): a daemon, as `marks_lane`,
    #: so a pass hung on the disk holds no exit (a stop waits for it `BACKGROUND_STOP_S`); one
    #: thread, so passes behind a hung one wait in its queue.
    retention_lane: Lane = field(default_factory=lambda: Lane("", name="timeline-retention"))
    #: The host certificate's validity as the start read it (`OpenedData.certificate`), for
    #: the banner (`host.startup.describe`); None when the start did not read it.
    certificate: Validity | None = None
    #: When `_saw_marked` last wrote which marked phones adb lists (monotonic).
    marks_seen_at: float = float("-inf")
    #: The thread the phones' unhealthy marks are written in (`_save_mark`): a daemon, as
    #: `folder_lane`, so a write hung on the disk holds no exit; one thread, so writes behind
    #: a hung one wait in its queue instead of piling up threads.
    marks_lane: Lane = field(default_factory=lambda: Lane("", name="unhealthy-marks"))
    #: Phones the registry forgot (`build_host`'s listener, in the poll's thread) whose kept
    #: marks `_drop_forgotten` has not deleted yet.
    forgotten: deque[str] = field(default_factory=deque)
    #: The refresh `_saw_marked` started, while under way: no second one starts behind it.
    marks_seen: asyncio.Future[None] | None = None
    #: The marks' writes under way or queued (`_write_mark`): a stopping host waits for them
    #: at most `BACKGROUND_STOP_S` (`serve_host`).
    marks_writing: set[asyncio.Future[None]] = field(default_factory=set)
    _background: list[asyncio.Task[None]] = field(default_factory=list)

    def paused(self) -> str:
        """Why the host takes no work on any phone: its data folder cannot be written
        (`host.timeline.data_folder`); "" when it takes work."""
        folder = self.lease.data_folder
        return folder.unwritable if folder is not None else ""

    def status(self) -> dict[str, Any]:
        """What the local console shows live: the stream, the phones, the running tasks."""
        paused = self.paused()
        return {
            "connected": self.lease.connected,
            "host_id": self.lease.host_id,
            "last_error": self.lease.last_error,
            "planner_transport": self.settings.planner_transport,
            "data_folder_unwritable": paused,
            "devices": [
                {
                    "serial": d.serial,
                    "model": d.model,
                    # As the cloud hears it: an unhealthy phone, or any while the host is
                    # paused, is offline; `unhealthy` says why.
                    "online": d.usable and not paused and not refused_serial(d.serial),
                    "shared_serial": d.shared or bool(d.adb_serial),
                    "unhealthy": d.unhealthy or paused,
                    # The cloud would refuse its id: left out of the hello, it gets no work.
                    "refused": refused_serial(d.serial),
                }
                for d in self.registry.devices()
            ],
            "running": [
                {
                    "task_id": spec.task_id,
                    "attempt": spec.attempt,
                    "device_serial": spec.device_serial,
                    "goal": spec.goal,
                    "step_index": snap.step_index,
                    "step_status": snap.status_name,
                    "summary": snap.summary,
                    "updated_at": snap.updated_at.isoformat() if snap.updated_at else None,
                }
                for spec, snap in self.lease.running()
            ],
            "pending_results": [list(k) for k in self.lease.pending_results()],
            "outbox": _backlog_dict(self.lease.backlog),
        }

    def phone_states(self) -> Iterator[tuple[str, bool, bool]]:
        """(serial, online, busy) of each phone, for the phones-by-state gauge (an unhealthy
        phone, or any while the host is paused, counts as offline: it takes no work, as the
        cloud hears it; so does one whose id the cloud refuses, which it never hears of)."""
        busy = {spec.device_serial for spec, _ in self.lease.running()}
        paused = bool(self.paused())
        for d in self.registry.devices():
            online = d.usable and not paused and not refused_serial(d.serial)
            yield d.serial, online, d.serial in busy

    def retain(self) -> None:
        """Start a retention pass in the background. An attempt's outcome goes to the lease
        client (which keeps the result on disk) before it: a pass deleting many files takes
        seconds, and a host killed meanwhile lost the result, so the task ran again."""
        job = asyncio.create_task(_retention_pass(self), name="retention")
        self._background.append(job)
        job.add_done_callback(self._background.remove)

    async def wait_background(self, timeout_s: float) -> None:
        """Let the background work (retention passes) finish, before `close` closes the stores
        it uses, for at most `timeout_s`: a pass hung on the disk (a dead NFS mount, a dying
        disk) is left to its daemon thread, as the marks' refresh is (`serve_host`); waited
        for without a bound, it held the host's exit for as long as it hung."""
        if not self._background:
            return
        _, late = await asyncio.wait(list(self._background), timeout=timeout_s)
        for job in late:
            log.warning("the retention pass still waits on the disk: the host stops without it")
            job.cancel()

    def close(self) -> None:
        self.registry.close()
        self.lanes.close()
        self.folder_lane.shutdown(wait=False, cancel_futures=True)  # a hung write is left
        self.marks_lane.shutdown(wait=False, cancel_futures=True)  # so is a mark's
        self.retention_lane.shutdown(wait=False, cancel_futures=True)  # and a retention pass
        self.outbox_lane.shutdown(wait=False, cancel_futures=True)  # and an outbox read
        if self.ocr is not None:
            self.ocr.close()
        self.store.close(wait_s=BACKGROUND_STOP_S)
        if self.outbox is not None:
            self.outbox.close(wait_s=BACKGROUND_STOP_S)


def backlog_proto(backlog: Backlog) -> types_pb2.OutboxBacklog:
    """The outbox backlog as the lease stream reports it."""
    out = types_pb2.OutboxBacklog(
        items=backlog.items, decisions=backlog.decisions, refused=backlog.refused
    )
    if backlog.oldest_at is not None:
        out.oldest_at.FromDatetime(backlog.oldest_at)
    return out


def _backlog_dict(backlog: types_pb2.OutboxBacklog | None) -> dict[str, Any] | None:
    if backlog is None:
        return None
    oldest = backlog.oldest_at.ToDatetime(tzinfo=UTC) if backlog.HasField("oldest_at") else None
    return {
        "items": backlog.items,
        "decisions": backlog.decisions,
        "refused": backlog.refused,
        "oldest_at": oldest.isoformat() if oldest else None,
    }


def driver_factory(settings: HostSettings, registry: DeviceRegistry | None = None) -> DriverFactory:
    """Drivers for phones behind the configured adb server (real or virtual). `registry`
    says how adb reaches each phone: by transport id where phones share a serial (the id
    the host gives such a phone is not one adb knows)."""

    def make(serial: str) -> Driver:
        info = registry.get(serial) if registry is not None else None
        tid = info.address if info is not None else None
        if tid is not None and info is not None:
            # Sent nothing once the adb server that numbered it ended (`adb_restarts`).
            watch = adb_restarts.watch(settings.adb_host, settings.adb_port)
            tid = adb_restarts.TransportId(tid, watch, info.adb_run)
        adb_serial = (info.adb_serial if info is not None else "") or serial
        if settings.driver == "uiautomator2":
            # Loaded here: uiautomator2 (and its lxml) is for this driver only, not the default.
            from host.devices.u2_driver import U2Driver

            return U2Driver(
                serial,
                settings.adb_host,
                settings.adb_port,
                settings.u2_rpc_timeout_s,
                transport_id=tid,
                adb_serial=adb_serial,
            )
        return AdbDriver(
            serial,
            settings.adb_host,
            settings.adb_port,
            timeout_s=settings.adb_call_timeout_s,
            dump_timeout_s=settings.dump_timeout_s,
            screenshot_timeout_s=settings.screenshot_timeout_s,
            transport_id=tid,
        )

    return make


def virtual_serials(count: int) -> list[str]:
    """Emulator-style serials for virtual phones: emulator-5554, emulator-5556, …"""
    return [f"emulator-{5554 + 2 * i}" for i in range(count)]


def start_virtual_phones(settings: HostSettings) -> tuple[ThreadedAdbServer, HostSettings]:
    """Start `settings.virtual_phones` virtual phones behind an in-process adb server.

    Returns the server (stop it when done) and settings pointing the host at it, so the host
    drives virtual phones exactly as real ones: adbutils over the adb protocol.
    """
    from host.devices.virtual.adb_server import ThreadedAdbServer
    from host.devices.virtual.phone import VirtualPhone

    phones = [VirtualPhone(s) for s in virtual_serials(settings.virtual_phones)]
    server = ThreadedAdbServer(phones)
    port = server.start(settings.adb_host)
    updated = settings.model_copy(update={"adb_port": port, "driver": "adbutils"})
    return server, updated


def _restore_marks(
    marks: list[tuple[str, int, str, str]], health: PhoneHealth, registry: DeviceRegistry
) -> None:
    """The unhealthy marks of the last run (`TimelineStore.keep_unhealthy`, as `open_data`
    read them): each phone stays out of work, reported OFFLINE with why from the first hello,
    until a probe, due at once, works. A mark whose phone a running host saw unlisted by adb
    for `device_forget_after_s` is not among them (the phone would have been forgotten;
    `_saw_marked` counts how long it was unlisted while a host ran: the time no host ran does
    not count), and `settle_last_run` deletes it."""
    for serial, attempts, last, part in marks:
        mark = Unreadable(attempts, last, "action" if part == "action" else "look")
        health.restore(serial, mark)
        registry.mark_unhealthy(serial, mark.words(serial, health.probe_s))
        log.warning("phone %s was unhealthy when the host stopped: probing it first", serial)


def _sessions(settings: HostSettings, planner: StepPlanner | None) -> bool:
    """Whether this host keeps session conversations (direct transport, session mode, no
    planner given); a configuration the model cannot take is refused now, at start, not at
    the first task."""
    planner_settings = PlannerSettings()
    if (
        planner is None
        and settings.planner_transport == "direct"
        and planner_settings.mode == "session"
    ):
        model_profiles.check(model_profiles.resolve(planner_settings), planner_settings)
        return True
    return False


def _transport(settings: HostSettings) -> types_pb2.PlannerTransport.ValueType:
    if settings.planner_transport == "cloud":
        return types_pb2.PLANNER_TRANSPORT_CLOUD
    return types_pb2.PLANNER_TRANSPORT_DIRECT


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def build_host(
    settings: HostSettings,
    *,
    planner: StepPlanner | None = None,
    make_driver: DriverFactory | None = None,
    channel_factory: Callable[[], grpc.aio.Channel] | None = None,
    opened: OpenedData | None = None,
) -> HostApp:
    """Assemble a host. `planner` overrides the direct planner (tests, the embedded demo).
    `opened`: its data folder's work done already (`open_data`, as `run_host` does it off the
    event loop; without settling, `settle=False`, the caller settles: `settle_at_start`);
    else done here, settling included."""
    too_fast = keepalive_warning(settings)  # said once per start
    if too_fast:
        log.warning("%s", too_fast)
    sessions = _sessions(settings, planner)
    opened = opened or open_data(settings, sessions=sessions)
    store, outbox = opened.store, opened.outbox
    ocr = OcrPool(settings.tessdata_path, settings.ocr_language) if settings.ocr_enabled else None
    perceiver = Perceiver(
        ocr,
        settings.hierarchy_retries,
        settings.hierarchy_retry_delay_s,
        deadline_s=settings.hierarchy_deadline_s,
    )
    health = PhoneHealth(settings.unhealthy_after_attempts, settings.unhealthy_probe_s)
    registry = DeviceRegistry(
        settings.adb_host,
        settings.adb_port,
        settings.device_serials,
        forget_after_s=settings.device_forget_after_s,
    )

    forgotten: deque[str] = deque()

    def let_go(info: DeviceInfo, kind: ChangeKind) -> None:
        """A forgotten phone's uiautomator2 Device goes with it (see `release_phone`), and so
        does what the host knew of its health (its kept mark: by the poll, `_drop_forgotten`)."""
        if kind == "forgotten":
            # Only a U2Driver keeps a Device, so a host that never loaded its module has none.
            u2_driver = sys.modules.get("host.devices.u2_driver")
            if u2_driver is not None:
                u2_driver.release_phone(settings.adb_host, settings.adb_port, info.serial)
            health.forget(info.serial)
            forgotten.append(info.serial)

    registry.add_listener(let_go)
    forget = timedelta(seconds=settings.device_forget_after_s)
    _restore_marks(opened.marks, health, registry)
    make_driver = make_driver or driver_factory(settings, registry)
    planner_channel: ChannelOnce | None = None
    planner_settings = PlannerSettings()
    session_store = opened.session_store
    compact_engine: Planner | None = None
    direct_transport = settings.planner_transport == "direct"
    if planner is None and direct_transport and not sessions:
        from planner.planner import make_planner

        compact_engine = make_planner(planner_settings)
    # The outbox's channel (opened when its sender starts) and the planner's (at once) are
    # kept, made again once the lease stream's connection read new certificate files (issued
    # again): all read them off the event loop, bounded, one read at a time
    # (`cloud_channel.read_issued`).
    outbox_channel: ChannelOnce | None
    channels: Callable[[], Any]
    if channel_factory is None:
        outbox_channel = ChannelOnce(settings)
        channels = outbox_channel.get
    else:
        outbox_channel, channels = None, channel_factory

    # The app owns the lease client, which keeps `run_task`: a strong reference back from it
    # made a cycle, and a stopped host waited for the cycle collector to be freed.
    app_ref: weakref.ref[HostApp] | None = None

    async def run_task(
        spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
    ) -> TaskOutcome:
        app = app_ref() if app_ref is not None else None
        assert app is not None, "the lease client outlived its host"
        return await _run_task(app, spec, progress, cancel)

    def ended(spec: TaskSpec, outcome: TaskOutcome) -> None:
        store.finish_task(spec.task_id, spec.attempt, outcome.status, outcome.summary)

    dialer = LeaseDialer(settings)  # its files read off the loop, at each connection
    lease = LeaseClient(
        channel_factory or dialer,
        registry,
        run_task,
        LeaseClientConfig(
            agent_version=settings.agent_version,
            planner_transport=_transport(settings),
            reconnect_initial_s=settings.reconnect_initial_s,
            reconnect_max_s=settings.reconnect_max_s,
            progress_renew_min_interval_s=settings.progress_renew_min_interval_s,
            stop_grace_s=settings.stop_grace_s,
            phone_lost_grace_s=settings.phone_lost_grace_s,
            cloud_address=settings.cloud_address,
        ),
        results=outbox,  # a result outlives this process until the cloud answers it
        ended=ended,
        data_folder=DataFolder(
            settings.resolved_db_path.parent,
            settings.data_dir_probe_s,
            others=(settings.resolved_artifact_dir, settings.resolved_outbox_path.parent),
            name=opened.name,
        ),
        replaced=None if channel_factory else dialer.replaced,
    )
    # Any write the disk refuses (timeline, screenshot, outbox) pauses the host, naming the
    # folder that refused (also the ones told while the stores opened and settled).
    opened.faults.forward(_tell_weakly(lease))
    if opened.unsettled:
        lease.disk_refused(opened.unsettled, settings.resolved_db_path)  # if no store told it
        assert lease.data_folder is not None
        lease.data_folder.owe(functools.partial(settle_last_run, store, outbox, forget))
    if settings.planner_transport == "cloud" and planner is None:
        # The planner's own channel carries the trace context of each step to the cloud.
        planner_channel = ChannelOnce(
            settings, tracing.client_interceptors(), factory=channel_factory
        )
        if _loop_running():  # read now, while the certificate is the one the start checked
            planner_channel.open()
    outbox_lane = Lane("", name="outbox")
    sender = OutboxSender(
        outbox,
        channels,
        initial_s=settings.outbox_retry_initial_s,
        max_s=settings.outbox_retry_max_s,
        lane=outbox_lane,
        explain=functools.partial(failure, settings=settings),
        follow=outbox_channel is not None,  # new certificate files: the next batch uses them
    )
    lease.on_welcome.append(sender.cloud_back)
    if channel_factory is None:  # whom this host is: files naming another are refused
        lease.on_welcome.append(dialer.welcomed)
    cloud_back = CloudBack()
    lease.on_welcome.append(cloud_back.said)
    app = HostApp(
        settings=settings,
        store=store,
        registry=registry,
        perceiver=perceiver,
        ocr=ocr,
        lease=lease,
        cloud_back=cloud_back,
        make_driver=make_driver,
        direct_planner=planner,
        planner_channel=planner_channel,
        outbox_channel=outbox_channel,
        session_store=session_store,
        planner_settings=planner_settings,
        compact_engine=compact_engine,
        outbox=outbox,
        outbox_sender=sender,
        outbox_lane=outbox_lane,
        health=health,
        forgotten=forgotten,
        shipments=Shipments(
            outbox, settings.planner_transport, screenshots=settings.ship_screenshots
        ),
        certificate=opened.certificate,
    )
    app_ref = weakref.ref(app)
    host_metrics.phones.watch(app)
    return app


async def _run_task(
    app: HostApp, spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
) -> TaskOutcome:
    """One assignment: a driver for its phone, a planner for its lease, the loop (retention
    follows in the background, `HostApp.retain`)."""
    s = app.settings
    planner: StepPlanner
    session: DirectPlanner | None = None
    if app.session_store is not None and app.planner_settings is not None:
        # Imported here: the provider SDKs cost a host ~60 MiB, and only a host that calls the
        # model itself (direct transport) needs them.
        from planner.session.factory import open_session_planner

        session = DirectPlanner(
            await open_session_planner(
                app.planner_settings,
                store=app.session_store,
                task_id=spec.task_id,
                attempt=spec.attempt,
                on_thinking=app.thinking.sink(spec.task_id, spec.attempt),
            ),
            flows=spec.flows,
            budget=spec.budget,
            spent=spec.spent,
            fleet_day=spec.fleet_day,
            withdrawn=spec.withdrawn_flows,
        )
        planner = ClearingPlanner(session, app.thinking, spec.task_id, spec.attempt)
    elif app.direct_planner is not None:
        planner = app.direct_planner
    elif app.compact_engine is not None:
        planner = DirectPlanner(
            app.compact_engine,
            spec.flows,
            budget=spec.budget,
            spent=spec.spent,
            fleet_day=spec.fleet_day,
            withdrawn=spec.withdrawn_flows,
        )
    else:
        planner = cloud_planner(app, spec)
    driver = await asyncio.to_thread(app.make_driver, spec.device_serial)
    try:
        # The phone's lane is kept while this attempt holds it (see host.devices.lanes).
        with app.lanes.use(spec.device_serial) as lane:
            loop = AgentLoop(
                driver,
                planner,
                app.perceiver,
                app.store,
                LoopSettings(
                    max_steps=s.max_steps,
                    settle_delay_s=s.settle_delay_s,
                    send_screenshot=s.send_screenshot,
                    ocr=app.ocr is not None,
                    planner_transport=s.planner_transport,
                    planner_wait=WaitPolicy(s.planner_wait_initial_s, s.planner_wait_max_s),
                    host_id=app.lease.host_id or s.host_id,
                    finishes_timeline=False,  # the lease client's `ended`, after the result
                    data_folders=(
                        tuple(app.lease.data_folder.folders) if app.lease.data_folder else ()
                    ),
                ),
                shipments=app.shipments,
                lane=lane,
                cloud_back=app.cloud_back,
            )
            outcome = await loop.run(spec, progress, cancel)
    finally:
        app.thinking.clear(spec.task_id, spec.attempt)
        if session is not None:
            await session.aclose()
    if outcome.device_gone:
        app.registry.mark_offline(spec.device_serial, outcome.adb_state)
    mark = app.health.attempt_ended(spec.device_serial, outcome.unreadable, outcome.unreadable_part)
    if mark is not None:
        words = mark.words(spec.device_serial, app.health.probe_s)
        log.warning("%s", words)
        app.registry.mark_unhealthy(spec.device_serial, words)
        keep = functools.partial(
            app.store.keep_unhealthy, spec.device_serial, mark.attempts, mark.last, mark.part
        )
        _write_mark(app, spec.device_serial, "saved", keep)  # not awaited: the mark stands
    app.retain()
    return outcome


def cloud_planner(app: HostApp, spec: TaskSpec) -> CloudPlanner:
    """The cloud transport's planner for one attempt (the cloud chooses compact or session
    mode itself), on the channel opened at start: a failed call names the host certificate
    when the cloud refused it (`failure`), as the channel outlives the certificate."""
    assert app.planner_channel is not None
    s = app.settings
    return CloudPlanner(
        app.planner_channel.get,
        spec.task_id,
        spec.attempt,
        spec.lease_id,
        send_screenshot=s.send_screenshot,
        timeout_s=s.planner_deadline_s,
        explain=functools.partial(failure, settings=s),
        replaced=app.planner_channel.replaced,  # a step refused for a rotated certificate
    )


def _start_probes(app: HostApp) -> None:
    """Probe each unhealthy phone due for it that adb lists online, each in a task of its own:
    a look may take the driver's whole timeout, which the device poll must not wait for."""
    for serial in app.health.due():
        info = app.registry.get(serial)
        if serial not in app.probes and info is not None and info.online:
            job = asyncio.create_task(_probe(app, serial), name=f"probe-{serial}")
            app.probes[serial] = job
            job.add_done_callback(functools.partial(_probe_done, app, serial))


def _probe_done(app: HostApp, serial: str, _: asyncio.Task[None]) -> None:
    app.probes.pop(serial, None)


async def _probe(app: HostApp, serial: str) -> None:
    """One look at an unhealthy phone (`Perceiver.probe`), in its lane; a look that works puts
    it back to work."""
    mark = app.health.of(serial)
    act = mark is not None and mark.part == "action"  # probe what failed
    try:
        with app.lanes.use(serial) as lane:  # a daemon thread: a hung look holds no exit
            loop = asyncio.get_running_loop()
            driver = await loop.run_in_executor(lane, app.make_driver, serial)
            await loop.run_in_executor(lane, app.perceiver.probe, driver, act)
    except Exception as exc:
        app.health.probed(serial, ok=False, found=str(exc))
        log.info("phone %s is still unreadable: %s", serial, exc)
        mark = app.health.of(serial)
        if mark is not None:  # its reason says what the probe found (no UI tree, say)
            app.registry.mark_unhealthy(serial, mark.words(serial, app.health.probe_s))
        return
    if app.health.probed(serial, ok=True):
        log.warning("phone %s can be read again: it takes work again", serial)
        app.registry.mark_healthy(serial)
        _write_mark(app, serial, "dropped", functools.partial(app.store.drop_unhealthy, serial))


def _tell_weakly(lease: LeaseClient) -> Callable[[str | None, Path | None], None]:
    """`lease.disk_refused`, for the stores to call, holding the lease client weakly: the
    lease client holds the stores, and a store holding it back (the outbox's listener held the
    outbox too) made cycles that only the cycle collector frees, so a stopped host's lease
    client and timeline stayed in memory until it ran."""
    method = weakref.WeakMethod(lease.disk_refused)

    def tell(reason: str | None, where: Path | None = None) -> None:
        bound = method()
        if bound is not None:
            bound(reason, where)

    return tell


def _save_mark(lease: LeaseClient, serial: str, done: str, write: Callable[[], None]) -> None:
    """Write a phone's kept mark (`TimelineStore.keep_unhealthy` / `drop_unhealthy`; `done`
    names which, for the log). The mark in memory stands whatever the write does, so a failed
    one costs only its copy on disk: raised, it replaced the attempt's real outcome with a
    step-0 host error (and skipped retention), or left the registry's poll mid-way (that
    poll's device report and probes skipped). A disk fault pauses the host as any write the
    data folder refuses does (`host.timeline.data_folder`)."""
    try:
        write()
    except Exception as exc:
        log.error("the unhealthy mark of phone %s could not be %s: %s", serial, done, exc)
        lease.disk_refused(storage_fault(exc))


def _write_mark(
    app: HostApp, serial: str, done: str, write: Callable[[], None]
) -> asyncio.Future[None]:
    """`_save_mark` in `HostApp.marks_lane`, not awaited by whoever marks the phone: the mark
    in memory stands whatever the disk does, and an attempt's end awaiting its save held its
    result (and the phone's next report) for as long as a write hung on the disk. A stopping
    host waits for it at most `BACKGROUND_STOP_S` (`serve_host`)."""
    job = asyncio.get_running_loop().run_in_executor(
        app.marks_lane, _save_mark, app.lease, serial, done, write
    )
    app.marks_writing.add(job)
    job.add_done_callback(app.marks_writing.discard)
    return job


def _drop_forgotten(app: HostApp) -> None:
    """Delete the kept marks of the phones the registry forgot, each in `HostApp.marks_lane`
    (`_write_mark`). Deleted in the registry's listener, in the poll's thread (asyncio's
    pool), a delete hung on the disk stalled the poll (no phone came or went, no probe
    started) and held the host's exit for as long as it hung."""
    while app.forgotten:
        serial = app.forgotten.popleft()
        _write_mark(app, serial, "dropped", functools.partial(app.store.drop_unhealthy, serial))


def _saw_marked(app: HostApp) -> None:
    """Say on disk, at most every `MARKS_SEEN_EVERY_S` (a quarter of `device_forget_after_s`
    when that is shorter), that the host looked and which marked phones adb still lists: a
    restart forgets a mark by how long its phone was absent while a host ran
    (`TimelineStore.saw_unhealthy`), not by its age nor by the host's own downtime. Not
    awaited, as the probes: the device poll must not wait for a disk that hangs. In
    `HostApp.marks_lane`, a daemon thread, and a stopping host waits for it only so long
    (`serve_host`): on asyncio's pool and among the background work a stop waits for, a write
    hung on the disk held the host's exit for as long as it hung."""
    now = time.monotonic()
    every = min(MARKS_SEEN_EVERY_S, app.settings.device_forget_after_s / 4)
    if now - app.marks_seen_at < every or app.marks_seen is not None:
        return
    unlisted_s = now - app.marks_seen_at if app.marks_seen_at > float("-inf") else 0.0
    app.marks_seen_at = now
    marked = app.health.marked()
    if marked:
        listed = [s for s in marked if app.registry.listed(s)]
        saw = functools.partial(app.store.saw_unhealthy, listed, unlisted_s)
        job = _write_mark(app, ", ".join(marked), "refreshed", saw)
        app.marks_seen = job
        job.add_done_callback(lambda _: setattr(app, "marks_seen", None))


def _start_folder_probe(app: HostApp) -> None:
    """Probe a data folder that refused a write, when due, in a task of its own: a write to
    a disk that hangs (NFS, a dying disk) may never return, which the device poll must not
    wait for."""
    folder = app.lease.data_folder
    if app.folder_probe is None and folder is not None and folder.due():
        job = asyncio.create_task(_probe_data_folder(app, folder), name="probe-data-folder")
        app.folder_probe = job
        job.add_done_callback(lambda _: setattr(app, "folder_probe", None))


async def _probe_data_folder(app: HostApp, folder: DataFolder) -> None:
    """One write to the data folder; one that works puts the host back to work
    (`host.timeline.data_folder`)."""
    try:
        loop = asyncio.get_running_loop()
        cleared = await loop.run_in_executor(app.folder_lane, folder.probe)
    except (OSError, sqlite3.Error) as exc:  # the probe's file there, or an owed write
        log.info("the host's data folder still cannot be written: %s", exc)
        return
    if cleared:
        log.warning("the data folders %s can be written again: the host takes work again",
                    ", ".join(map(str, folder.folders)))  # fmt: skip
        app.lease.writable_again()


async def _retention_pass(app: HostApp) -> None:
    s = app.settings
    try:
        prune = functools.partial(
            app.store.prune,
            s.retention_max_tasks,
            s.retention_max_age_days,
            stop=app.retention_stop,
        )
        pruned = await asyncio.get_running_loop().run_in_executor(app.retention_lane, prune)
        if pruned:
            log.info("retention removed %d old task(s)", len(pruned))
        await _forget_sessions(app, pruned)
    except Exception:  # retention must never fail a task
        log.exception("retention pass failed")


async def _forget_sessions(app: HostApp, pruned: list[tuple[str, int]]) -> None:
    """Session conversations go with their timeline rows (same retention, same moment)."""
    if app.session_store is None:
        return
    for task_id in sorted({task_id for task_id, _ in pruned}):
        await app.session_store.delete(task_id)


async def _poll_devices(app: HostApp, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            held = {spec.device_serial for spec, _ in app.lease.running()}
            await asyncio.to_thread(app.registry.refresh, held)
            _drop_forgotten(app)
            app.lanes.retire({d.serial for d in app.registry.devices() if d.online})
            _start_probes(app)
            _start_folder_probe(app)
            _saw_marked(app)
        except Exception:
            log.exception("device poll failed")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(app.settings.device_poll_interval_s):
                await stop.wait()


async def _report_backlog(app: HostApp, stop: asyncio.Event) -> None:
    """Tell the cloud what the outbox still holds whenever it changes (at most about once a
    second; the hello of each new stream carries the latest)."""
    sender = app.outbox_sender
    assert sender is not None and app.outbox is not None
    while not stop.is_set():
        waits = [asyncio.ensure_future(e.wait()) for e in (sender.changed, stop)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if stop.is_set():
            return
        sender.changed.clear()
        try:
            backlog = await sender.use(app.outbox.backlog)  # its daemon thread: see `use`
        except Exception:
            log.exception("could not read the outbox backlog")
        else:
            app.lease.report_outbox(backlog_proto(backlog))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()


#: How long a stopping host lets its outbox finish a send under way (after the lease stream
#: had `stop_grace_s` for its results): anything unsent is durable and goes at the next start.
BACKGROUND_STOP_S = 2.0


async def _send_outbox(app: HostApp, stop: asyncio.Event) -> None:
    """The outbox's sender, started once the lease stream made its first channel (its
    certificate files read and found usable), or not at all when the host stops first. Started
    with the host, its first try at the files said "outbox: no channel to the cloud yet: … does
    not exist" beside the one line of a host whose files are not there (exit 2)."""
    assert app.outbox_sender is not None
    waits = [asyncio.ensure_future(e.wait()) for e in (app.lease.dialed, stop)]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if not stop.is_set():
        await app.outbox_sender.run(stop)


async def serve_host(app: HostApp, stop: asyncio.Event) -> None:
    """Run an assembled host until `stop` is set (no signal handling here).

    The retention pass at start runs beside the lease stream, not before it: deleting many old
    files takes seconds to minutes, and a host restarted after a kill sent the results its
    previous process kept (naming their leases, else the cloud runs the tasks again) only
    once it was done."""
    app.retain()
    await asyncio.to_thread(app.registry.refresh)
    if app.outbox is not None and app.outbox_sender is not None:
        # No file named to the pause (`disk_refused`'s `where`): it is looked at, on the loop.
        backlog = await read_at_start(
            app.outbox.backlog,
            "the outbox's backlog",
            refused=app.lease.disk_refused,
            folder=app.lease.data_folder,
        )  # a read returned late is not used: `_report_backlog` reports the next change
        if backlog is not None:
            app.lease.backlog = backlog_proto(backlog)
    poller = asyncio.create_task(_poll_devices(app, stop))
    background: list[asyncio.Task[None]] = []
    if app.outbox_sender is not None:
        background = [
            asyncio.create_task(_send_outbox(app, stop), name="outbox"),
            asyncio.create_task(_report_backlog(app, stop), name="outbox-report"),
        ]
    try:
        await app.lease.run(stop)
    finally:
        stop.set()
        await poller
        probes = [*app.probes.values(), *filter(None, [app.folder_probe])]
        for probe in probes:  # a dump under way ends in its lane
            probe.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await probe
        if background:
            # A send in flight on a link gone silent would hold the exit for its whole deadline
            # (the outbox's 30 s): what it carried stays in the outbox for the next start.
            _, late = await asyncio.wait(background, timeout=BACKGROUND_STOP_S)
            for job in late:
                job.cancel()
        for job in background:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await job
        if (
            app.marks_writing
            and (await asyncio.wait(list(app.marks_writing), timeout=BACKGROUND_STOP_S))[1]
        ):
            log.warning(
                "a write of the unhealthy marks still waits on the disk: the host stops "
                "without it (a restart knows those marks as last written)"
            )
        app.retention_stop.set()
        await app.wait_background(BACKGROUND_STOP_S)
        for channel in (app.planner_channel, app.outbox_channel):
            if channel is not None:
                await channel.close()
        for owned in (app.direct_planner, app.compact_engine):
            aclose = getattr(owned, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        app.close()


async def _open_data(
    settings: HostSettings, stop: asyncio.Event, *, sessions: bool
) -> OpenedData | None:
    """The host certificate checked and the data folder's start work done (`open_data`), in a
    daemon thread of their own: None when `stop` was set first. Each reads or writes files
    that may be on a disk that hangs (a dead NFS mount): made on the event loop, they stopped
    it before the host ran, and SIGTERM (whose handler runs on the loop) did nothing; a
    supervisor had to SIGKILL the host. A stopped start leaves the thread to its disk (it
    holds no exit). A certificate the cloud would refuse stops the start (CertificateInvalid
    names it); one about to expire is said once, here."""

    def start_work() -> OpenedData:
        validity = check_certificate(settings)
        soon = expiry_warning(validity)
        if soon:
            log.warning("%s", soon)
        opened = open_data(settings, sessions=sessions, settle=False)
        opened.certificate = validity  # the banner's date, not read again on the event loop
        return opened

    lane = Lane("", name="start-disk")
    job: asyncio.Future[Any] = asyncio.wrap_future(lane.submit(start_work))
    lane.shutdown(wait=False)  # the thread ends after the work
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({job}, timeout=start_reads.START_READ_S)
        if not done:
            log.error(
                "opening the data folder %s did not return within %g s: the disk hangs; the "
                "host starts once it returns, and stops if told to meanwhile",
                settings.resolved_db_path.parent,
                start_reads.START_READ_S,
            )
            await asyncio.wait([job, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not job.done():
        log.warning("stopped before the data folder answered: the host never started")
        job.add_done_callback(_close_late)
        return None
    opened: OpenedData = job.result()
    return opened


async def settle_at_start(app: HostApp) -> None:
    """`settle_last_run` in a thread of its own, waited for at most `START_READ_S`, before the
    host dials the cloud: a disk that hangs starts the host paused, saying why, owing the
    settling (`read_at_start`); one that refuses it (full, read-only) too, owing it again
    (`owed`): a new attempt must not be taken before it (its row would be marked
    interrupted)."""
    assert app.outbox is not None and app.lease.data_folder is not None
    folder, db_path = app.lease.data_folder, app.settings.resolved_db_path
    forget = timedelta(seconds=app.settings.device_forget_after_s)
    settle = functools.partial(settle_last_run, app.store, app.outbox, forget)

    def owed() -> None:
        """The settling; refused by the disk, owed to the folder's probe (also when it
        returned after the host started)."""
        try:
            settle()
        except Exception as exc:
            if storage_fault(exc) is not None:
                folder.owe(settle)
            raise

    try:
        await read_at_start(
            owed,
            "what the last run left",
            refused=lambda reason: app.lease.disk_refused(reason, db_path),
            folder=folder,
            doing="settling",
        )
    except Exception as exc:
        reason = storage_fault(exc)
        if reason is None:
            raise
        # The disk filled after the stores opened: the host starts paused, its phones OFFLINE
        # with why, and settles once a probe write works. Exit 2 here (as for a folder it
        # cannot open) made a supervisor restart it in a loop.
        log.error("could not settle what the last run left: %s", reason)
        app.lease.disk_refused(reason, db_path)  # if no store told it


def _close_late(job: asyncio.Future[OpenedData]) -> None:
    """A start work that returned after the host stopped: its stores are closed."""
    if job.cancelled() or job.exception() is not None:
        return
    opened = job.result()
    opened.store.close()
    opened.outbox.close()


async def run_host(
    settings: HostSettings | None = None,
    stop: asyncio.Event | None = None,
    *,
    planner: StepPlanner | None = None,
    make_driver: DriverFactory | None = None,
    console: HostConsoleSettings | None = None,
    serve_metrics: bool = False,
    say: Callable[[str], None] | None = None,
) -> None:
    """Run a host until SIGINT/SIGTERM (or `stop`), then stop its tasks and return.

    With `console` settings, the local console (host/console/) is served beside it; with
    `serve_metrics`, Prometheus metrics at `settings.metrics_address` (`amc host run`). `say`
    hears what runs where once it is up (the start-up banner, `host/startup.py`).
    """
    settings = settings or HostSettings()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    built: list[HostApp] = []

    def on_signal() -> None:
        # The first hands the host's work back (within `stop_grace_s`); a second one stops at
        # once, for an operator who cannot wait.
        if stop.is_set():
            for app in built:
                app.lease.stop_now()
        stop.set()

    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread, or not supported here
    virtual = None
    try:
        if settings.device_source == "virtual":
            virtual, settings = start_virtual_phones(settings)
        opened = await _open_data(settings, stop, sessions=_sessions(settings, planner))
        if opened is None:
            return
        app = build_host(settings, planner=planner, make_driver=make_driver, opened=opened)
        built.append(app)
        try:
            await settle_at_start(app)
        except BaseException:
            app.close()
            raise
        # --- local console hook (host/console/, kept minimal): served in this loop, stopped
        # by `stop`; a refused or taken address fails here, before the host starts. ---
        console_task: asyncio.Task[None] | None = None
        if console is not None:
            from host.console.server import start_console_task

            try:
                console_task = start_console_task(app, console, stop)
            except BaseException:
                app.close()
                raise
        served: MetricsServer | None = None
        metrics_note = ""
        if serve_metrics:
            try:
                served = metrics_http.serve(settings.metrics_address, host_metrics.REGISTRY)
            except MetricsAddressError as exc:  # metrics are not worth refusing to run for
                metrics_note = f"NOT served: AMC_HOST_METRICS_ADDRESS {exc}"
                log.warning("metrics not served: AMC_HOST_METRICS_ADDRESS %s", exc)
        if say is not None:
            await asyncio.to_thread(app.registry.refresh)  # the banner names the phones
            for line in describe(app, metrics=served, metrics_note=metrics_note):
                say(line)
        try:
            await serve_host(app, stop)
        finally:
            if served is not None:
                await asyncio.to_thread(served.stop)
            if console_task is not None:
                stop.set()
                await console_task
    finally:
        if virtual is not None:
            await asyncio.to_thread(virtual.stop)
        for sig in installed:
            loop.remove_signal_handler(sig)
