"""One cloud replica: a grpc.aio server with every service, its background jobs, and `serve()`.

`build_server(settings)` gives a `CloudServer` that binds at construction (so `.port` is known,
also for port 0), starts with `start()` (migrations, the deny-list, LISTEN, dispatcher, sweeper,
retention, the database probe and deny-list refresh), and
stops with `stop(grace)`: health goes NOT_SERVING first, host streams are ended with UNAVAILABLE
so hosts reconnect to another replica, then in-flight RPCs get `grace` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import ipaddress
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    flow_service_pb2,
    flow_service_pb2_grpc,
    lease_service_pb2,
    lease_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
)
from cloud import cert_validity, gc_policy, metrics, pki, secret_box, supervised
from cloud.artifacts import ArtifactStore, every_format, open_artifact_store
from cloud.authz import Authorization
from cloud.boundary import Boundary
from cloud.db_probe import DatabaseProbe
from cloud.dispatch_holds import DispatchHolds
from cloud.events import EventBus
from cloud.flows.embeddings import Embedder
from cloud.flows.learning import FlowLearner
from cloud.flows.retrieval import Retriever
from cloud.key_files import warn_if_readable
from cloud.lease.clock import check_database_clock
from cloud.lease.database_clock import CHECK_INTERVAL_S as DATABASE_CLOCK_CHECK_S
from cloud.lease.database_clock import DatabaseClockWatch
from cloud.lease.manager import LeaseManager
from cloud.lease.stream import LeaseServicer
from cloud.provider_health import ProviderHealth
from cloud.reflection import enable_reflection
from cloud.revocations import Revocations
from cloud.services.artifact_service import ArtifactServicer
from cloud.services.decision_log_service import DecisionLogServicer
from cloud.services.fleet_service import FleetServicer
from cloud.services.flow_service import FlowServicer
from cloud.services.planner_service import CloudBudgets, build_planner_servicer
from cloud.services.progress_service import ProgressServicer
from cloud.services.task_service import TaskServicer
from cloud.settings import CloudSettings, SettingError
from cloud.store import decisions, errors, hosts, leases, screenshots, sessions, unsettled
from cloud.store.database import Store
from cloud.store.engine import IN_MEMORY_REFUSAL, upgrade, verify
from cloud.store.pool import OWN_CONNECTIONS
from cloud.store.replicas import Presence
from cloud.store.sqlite_file import (
    sqlite_file,
    sqlite_in_memory,
    sqlite_opens_existing_only,
    sqlite_read_only,
)
from planner.budget import dollars
from planner.planner import Planner
from telemetry import logs, metrics_http, tracing
from telemetry.metrics_http import MetricsAddressError, MetricsServer
from telemetry.redaction import scrub, shown_url

log = logging.getLogger(__name__)
Say = Callable[[str], None]

SERVICE_NAMES = (
    task_service_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name,
    lease_service_pb2.DESCRIPTOR.services_by_name["LeaseService"].full_name,
    progress_service_pb2.DESCRIPTOR.services_by_name["ProgressService"].full_name,
    fleet_service_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
    decision_log_service_pb2.DESCRIPTOR.services_by_name["DecisionLogService"].full_name,
    planner_service_pb2.DESCRIPTOR.services_by_name["PlannerService"].full_name,
    artifact_service_pb2.DESCRIPTOR.services_by_name["ArtifactService"].full_name,
    flow_service_pb2.DESCRIPTOR.services_by_name["FlowService"].full_name,
)


#: Request metadata (headers) the server takes, in gRPC's count (each entry's name and value
#: plus 32 bytes): gRPC core's own hard limit, so whatever it served at least sometimes before
#: is served always.
MAX_METADATA_BYTES = 16 * 1024
#: How often a running cloud looks at its server certificate's end date (and at start).
CERT_CHECK_INTERVAL_S = 86_400.0


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_options(settings: CloudSettings) -> list[tuple[str, Any]]:
    """Keepalive, connection age and message size options of the grpc server."""

    def ms(seconds: float) -> int:
        return int(seconds * 1000)

    return [
        ("grpc.keepalive_time_ms", ms(settings.keepalive_time_seconds)),
        ("grpc.keepalive_timeout_ms", ms(settings.keepalive_timeout_seconds)),
        # gRPC core >= 1.5x times out unanswered pings with this (default 60 s), not the above:
        # without it a half-open host connection lingers for a minute.
        ("grpc.http2.ping_timeout_ms", ms(settings.keepalive_timeout_seconds)),
        ("grpc.keepalive_permit_without_calls", 1),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            ms(settings.min_client_ping_interval_seconds),
        ),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_connection_age_ms", ms(settings.max_connection_age_seconds)),
        ("grpc.max_connection_age_grace_ms", ms(settings.max_connection_age_grace_seconds)),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # Request metadata: gRPC core refuses it above a soft limit (8 KiB by default) with a
        # probability rising to 1 at a hard one (16 KiB), so the same call passed or not at
        # random. Both at one value: up to it always served, above it always RESOURCE_EXHAUSTED.
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.so_reuseport", 0),
    ]


def server_credentials(settings: CloudSettings) -> grpc.ServerCredentials:
    """mTLS: the fleet CA must have signed the client's certificate."""
    ca, cert, key = settings.tls_paths()
    return grpc.ssl_server_credentials(
        [(settings.read_tls_file(key), settings.read_tls_file(cert))],
        root_certificates=settings.read_tls_file(ca),
        require_client_auth=True,
    )


def _cannot_listen(address: str) -> str | None:
    """Why `address` cannot be listened on right now (taken, not this machine's), or None."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit() or int(port) == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.create_server((host, int(port)), family=family):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


async def _set_serving(health_servicer: health.aio.HealthServicer, serving: bool) -> None:
    """Health of every service (after `stop()` began, it stays NOT_SERVING).

    Not a method: the database probe keeps it, and a bound method tied the replica into a
    cycle through its own probe, so a stopped replica waited for the cycle collector."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, status)


def _listen_credentials(settings: CloudSettings) -> grpc.ServerCredentials | None:
    """The credentials to listen with (None: plaintext), or a SettingError when the address
    cannot be listened on (taken, not this machine's, plaintext off loopback) or a
    certificate cannot be read."""
    address = settings.listen_address
    taken = _cannot_listen(address)
    if taken:  # said here: gRPC's own bind failure also logs a line of its own to stderr
        raise SettingError(
            "AMC_CLOUD_LISTEN_ADDRESS",
            f"cannot listen on {address} ({taken})",
            "pick a free port on an address of this machine, e.g. 127.0.0.1:50052",
        )
    if not settings.insecure:
        credentials = server_credentials(settings)  # says which file it cannot read
        ca, cert, key = settings.tls_paths()
        try:
            # Every host and operator would refuse it in the handshake, seeing only
            # "CERTIFICATE_VERIFY_FAILED: certificate has expired", never whose; a key that is
            # not the certificate's failed the bind, said as a port that cannot be listened on.
            cert_validity.check(cert, ca, "server certificate", key=key)
            if settings.pki_dir is not None:  # not read by the cloud, but kept beside its keys
                warn_if_readable(settings.pki_dir / pki.CA_KEY_FILE)
        except cert_validity.CertificateInvalid as exc:
            setting = "AMC_CLOUD_SERVER_CERT" if settings.server_cert else "AMC_CLOUD_PKI_DIR"
            raise SettingError(
                setting,
                str(exc),
                "issue a new one from the fleet CA with `amc certs init DIR` (it keeps the "
                "CA and writes server.pem and server.key)",
            ) from None
        return credentials
    if not _is_loopback(address):
        raise SettingError(
            "AMC_CLOUD_LISTEN_ADDRESS",
            f"plaintext is only allowed on loopback, not {address!r}",
            "listen on 127.0.0.1:<port>, or drop AMC_CLOUD_INSECURE and use mTLS",
        )
    return None


def _caps(max_tokens: int, max_cost_usd: float) -> str:
    """ "10,000 tokens, $5.00", or "none"."""
    parts = [f"{max_tokens:,} tokens"] if max_tokens else []
    parts += [dollars(max_cost_usd)] if max_cost_usd else []
    return ", ".join(parts) or "none"


def _open_store(url: str, pool_size: int) -> Store:
    """The store for AMC_CLOUD_DATABASE_URL; a URL no driver here can open, or a SQLite file in
    a folder that does not exist, is a SettingError. The folder was made, and a mistyped path
    started an empty fleet database (no hosts, no tasks, a new secrets check) with no word; the
    default file is in the working folder, and `amc up` makes its data folder itself."""
    _refuse_unopenable_sqlite(url)
    folder = _missing_sqlite_folder(url)
    if folder is not None:
        raise SettingError(
            "AMC_CLOUD_DATABASE_URL",
            f"the SQLite database's folder {folder} does not exist",
            "correct the path, or create the folder if a new database is meant",
        )
    try:
        return Store.from_url(url, pool_size)
    except Exception as exc:  # sqlalchemy ArgumentError / NoSuchModuleError, a missing driver
        raise SettingError(
            "AMC_CLOUD_DATABASE_URL",
            f"not a database URL this cloud can open ({type(exc).__name__}: {exc})",
            "use sqlite+aiosqlite:///path.sqlite3 or postgresql+psycopg://user:pass@host/db",
        ) from exc


def _refuse_unopenable_sqlite(url: str) -> None:
    """An in-memory SQLite database, or an SQLite URI that opens only an existing file
    (`mode=ro`, `mode=rw`, `immutable=1`) naming a missing one, is a SettingError. The first made
    the engine fail with a TypeError about pool arguments; the second had an empty file made
    for it, which SQLite itself would have refused to open."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # `Store.from_url` refuses it in its own words
    if sqlite_in_memory(parsed):
        raise SettingError(
            "AMC_CLOUD_DATABASE_URL",
            IN_MEMORY_REFUSAL,
            "for a throwaway cloud use a file in a temporary folder, "
            "e.g. sqlite+aiosqlite:////tmp/amc-demo/cloud.sqlite3 (or `amc up`)",
        )
    if sqlite_read_only(parsed):
        raise SettingError(
            "AMC_CLOUD_DATABASE_URL",
            "the SQLite URI opens the database read-only (mode=ro or immutable=1), and a "
            "cloud writes to its database from its first moment",
            "drop mode=ro / immutable=1 from the URI",
        )
    database = sqlite_file(parsed)
    if database is not None and sqlite_opens_existing_only(parsed) and not database.exists():
        raise SettingError(
            "AMC_CLOUD_DATABASE_URL",
            f"the SQLite database file {database} does not exist "
            "(the URI's mode=ro, mode=rw or immutable=1 opens an existing database only)",
            "correct the path, or drop mode/immutable from the URI to create a new database",
        )


def _missing_sqlite_folder(url: str) -> Path | None:
    """The folder of a SQLite database file at `url` when it does not exist, else None (not
    SQLite, in memory, or a URL that `Store.from_url` refuses by itself)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    database = sqlite_file(parsed)
    if database is None:
        return None
    folder = database.parent
    return None if folder.is_dir() else folder


def _embedder(settings: CloudSettings) -> Embedder | None:
    """The OpenAI embedder when `AMC_CLOUD_FLOW_SCORER=openai` (with the planner's OpenAI key;
    a missing key is a SettingError at start), else None: lexical scoring."""
    if not settings.flows_enabled or settings.flow_scorer != "openai":
        return None
    from cloud.flows.embeddings import OpenAIEmbedder
    from planner.errors import PlannerAuthError
    from planner.settings import PlannerSettings

    try:
        return OpenAIEmbedder(PlannerSettings(), settings.flow_embedding_model)
    except PlannerAuthError as exc:
        raise SettingError(
            "AMC_CLOUD_FLOW_SCORER",
            "openai embeddings need the planner's OpenAI key, and none is set",
            "set AMC_PLANNER_OPENAI_API_KEY (or OPENAI_API_KEY), or AMC_CLOUD_FLOW_SCORER=lexical",
        ) from exc


class CloudServer:
    """A bound, not yet started, cloud replica."""

    def __init__(
        self,
        settings: CloudSettings,
        store: Store | None = None,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        settings.check_ship_window()
        # Refused before anything is opened: a replica that failed halfway through here left
        # its store, bus and lease manager to the cycle collector (no one can stop it). (The
        # embedder, an OpenAI client, needs no closing until it has been used.)
        credentials = _listen_credentials(settings)
        self.embedder = _embedder(settings)  # refused here too when it has no key
        self.settings = settings
        key = settings.secrets_key.get_secret_value() if settings.secrets_key else None
        self.secrets = secret_box.from_settings(key, settings.secrets_key_file)
        self.artifacts = artifacts or open_artifact_store(settings)
        self.store = store or _open_store(settings.database_url, settings.database_pool_size)
        self._own_store = store is None
        self.bus = EventBus(self.store)
        self.presence = Presence(self.store, self.bus.replica_id)
        self.leases = LeaseManager(
            self.store, self.bus, settings, self.secrets, self.presence.others_alive
        )
        self.holds = DispatchHolds(self.store, self.bus.replica_id, self.bus.holds_changed)
        self.provider_health = ProviderHealth(
            self.holds,
            threshold=settings.provider_down_after_failures,
            probe_seconds=settings.provider_probe_seconds,
        )
        self.leases.dispatcher.provider = self.provider_health
        self.leases.dispatcher.holds = self.holds
        self.budgets = CloudBudgets(self.store, settings, self.holds)
        self.leases.dispatcher.daily_spent = self.budgets.daily_spent
        self.leases.dispatcher.fleet_day = self.budgets.fleet_day_known
        self.leases.fleet_day = self.budgets.fleet_day
        self.holds.on_lifted.append(self.leases.dispatcher.wake.set)
        self.bus.on_holds.append(self.leases.dispatcher.wake.set)
        self.retriever: Retriever | None = None
        self.learner: FlowLearner | None = None
        if settings.flows_enabled:
            self.retriever = Retriever(self.store, settings, self.embedder)
            self.learner = FlowLearner(self.store, settings, self.embedder)
            self.leases.dispatcher.flows = self.retriever
            self.leases.on_ended.append(self.learner.wake.set)
        self.health = health.aio.HealthServicer()
        self.database = DatabaseProbe(self.store, functools.partial(_set_serving, self.health))
        #: The start's clock check against PostgreSQL, repeated every minute while it runs.
        self.database_clock = DatabaseClockWatch(self.store, settings.clock_gap_seconds)
        self.revocations = Revocations(self.store)
        self.revocations.add_listener(self.leases.on_deny_list)
        self._revocations_wake = asyncio.Event()
        self.bus.on_revocations.append(self._revocations_wake.set)
        self.metrics = metrics.configure(enabled=settings.metrics_enabled)
        self.metrics_server: MetricsServer | None = None
        self.tracing = "off"
        self.server = grpc.aio.server(
            options=server_options(settings),
            # Outermost first: the trace span (it covers the authorization check too), who is
            # calling, then what they sent and how a failure reads.
            interceptors=[
                tracing.server_interceptor(),
                Authorization(insecure=settings.insecure, revoked=self.revocations),
                Boundary(on_unavailable=self.database.wake.set),
            ],
        )
        self._closeables: list[Any] = []
        self.planner_summary = ""
        self.metrics_note = ""
        self._jobs: list[asyncio.Task[None]] = []
        self._started = False
        self._stopped = False
        self._add_services()
        self.port = self._bind(credentials)

    def _add_services(self) -> None:
        s, store, bus = self.settings, self.store, self.bus
        task_service_pb2_grpc.add_TaskServiceServicer_to_server(
            TaskServicer(store, bus, s, self.secrets), self.server
        )
        lease_service_pb2_grpc.add_LeaseServiceServicer_to_server(
            LeaseServicer(self.leases), self.server
        )
        self._progress = ProgressServicer(store, bus)
        progress_service_pb2_grpc.add_ProgressServiceServicer_to_server(self._progress, self.server)
        fleet_service_pb2_grpc.add_FleetServiceServicer_to_server(
            FleetServicer(store, bus, s, self.provider_health, self.budgets.daily_hold), self.server
        )
        window = dt.timedelta(seconds=s.ship_window_seconds)
        decision_log_service_pb2_grpc.add_DecisionLogServiceServicer_to_server(
            DecisionLogServicer(store, window, flow_retire_after=s.flow_retire_after, bus=bus),
            self.server,
        )
        artifact_service_pb2_grpc.add_ArtifactServiceServicer_to_server(
            ArtifactServicer(store, self.artifacts, s), self.server
        )
        flow_service_pb2_grpc.add_FlowServiceServicer_to_server(FlowServicer(store), self.server)
        self._planner_servicer, self._closeables, self.planner_summary = build_planner_servicer(
            store,
            bus,
            self.provider_health,
            handed=self.retriever.handed if self.retriever is not None else None,
            budgets=self.budgets,
            clock_settled=self.leases.clock.settled,
        )
        self.holds.provider_free = self.provider_health.probe is None  # the offline planner
        self.presence.calls_provider = not self.holds.provider_free
        #: The compact planner Decide plans with (benches count its provider's calls).
        self.planner = next((c for c in self._closeables if isinstance(c, Planner)), None)
        if self.embedder is not None:
            self._closeables.append(self.embedder)
        planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(
            self._planner_servicer, self.server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection(self.server, (*SERVICE_NAMES, health.SERVICE_NAME))

    def _bind(self, credentials: grpc.ServerCredentials | None) -> int:
        address = self.settings.listen_address
        try:
            if credentials is None:
                return int(self.server.add_insecure_port(address))
            return int(self.server.add_secure_port(address, credentials))
        except RuntimeError as exc:  # grpc: "Failed to bind to address ..."
            raise SettingError(
                "AMC_CLOUD_LISTEN_ADDRESS",
                f"cannot listen on {address} ({exc})",
                "pick a free port on an address of this machine, e.g. 127.0.0.1:50052",
            ) from exc

    def describe(self) -> list[str]:
        """What runs, for the person who started it: address, store, planner, certificates
        (the database password is hidden, and any password in another URL)."""
        s = self.settings
        url = make_url(s.database_url)
        store = shown_url(url)
        shared = url.get_backend_name() == "postgresql"
        kind = (
            f"PostgreSQL: replicas may share it; up to {s.database_pool_size} pooled"
            f" connections + {OWN_CONNECTIONS} of its own, AMC_CLOUD_DATABASE_POOL_SIZE"
            if shared
            else "SQLite: one replica only"
        )
        security = "plaintext, loopback only" if s.insecure else "mTLS, fleet certificates"
        served = self.metrics_server
        if served is not None:
            metric_line = f"{served.url} (AMC_CLOUD_METRICS_ADDRESS)"
        else:
            metric_line = self.metrics_note or "not served (AMC_CLOUD_METRICS_ADDRESS=off)"
        caps = [
            f"task default {_caps(s.default_task_max_tokens, s.default_task_max_cost_usd)}",
            f"fleet daily {_caps(s.daily_max_tokens, s.daily_max_cost_usd)}",
        ]
        return [
            f"amc cloud listening on {self.address} ({security})",
            f"  store:        {store} ({kind})",
            # Scrubbed: an endpoint URL may carry credentials (`http://user:pass@minio:9000`).
            f"  planner:      {scrub(self.planner_summary)}",
            f"  screenshots:  {scrub(self.artifacts.describe())} (AMC_CLOUD_ARTIFACT_* settings)",
            f"  budgets:      {'; '.join(caps)}",
            f"  certificates: {s.tls_source()}",
            "  secrets:      "
            + (
                "encrypted at rest (AMC_CLOUD_SECRETS_KEY)"
                if self.secrets is not None
                else "refused (no AMC_CLOUD_SECRETS_KEY: tasks with secrets cannot be submitted)"
            ),
            f"  metrics:      {metric_line}",
            f"  tracing:      {self.tracing}",
            f"  logs:         {logs.describe(logs.LogSettings().format)}",
            "  stop with Ctrl-C",
        ]

    def serve_metrics(self, address: str | None = None) -> MetricsServer | None:
        """Serve this process's cloud metrics at `address` (default: the setting). A taken or
        bad address does not stop the replica: the banner says why there are no metrics."""
        address = self.settings.metrics_address if address is None else address
        try:
            self.metrics_server = metrics_http.serve(address, metrics.REGISTRY)
        except MetricsAddressError as exc:
            self.metrics_note = f"NOT served: AMC_CLOUD_METRICS_ADDRESS {exc}"
            log.warning("metrics not served: AMC_CLOUD_METRICS_ADDRESS %s", exc)
        return self.metrics_server

    @property
    def address(self) -> str:
        """host:port clients should dial."""
        host = self.settings.listen_address.rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", ""):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Migrate, start background jobs and serve.

        A start that fails stops what it began before the error is raised: the event bus's
        LISTEN, the lease jobs and the pool ran on behind a replica nobody would stop (a test
        fixture stops only what started, and `stop` runs once)."""
        try:
            await self._start()
        except BaseException:
            with contextlib.suppress(Exception):  # each failed step is logged; the start's
                await self.stop(0)  # error is the one to raise
            raise

    async def _start(self) -> None:
        if self.settings.migrate_on_start:
            await upgrade(self.store.engine)
        else:
            await verify(self.store.engine)
        # Before anything holds an expiry against this replica's clock (the new term after an
        # outage, sweeps, renewals).
        await check_database_clock(self.store, self.settings.clock_gap_seconds)
        await self.revocations.refresh()  # before the first call is served
        await self.bus.start()
        await self.holds.refresh()  # a hold set before this replica started holds here too
        await self._after_outage()
        self.leases.start()
        self._jobs.append(
            supervised.start(
                "retention", self._retention_pass, interval=self.settings.retention_interval_seconds
            )
        )
        if self.learner is not None:
            self._jobs.append(
                supervised.start(
                    "flow-learning",
                    self.learner.step,
                    interval=self.settings.flow_learning_interval_seconds,
                    wake=self.learner.wake,
                )
            )
        if self.store.is_sqlite:
            self._jobs.append(
                supervised.start(
                    "sqlite-checkpoint",
                    self.store.checkpoint,
                    interval=self.settings.sqlite_checkpoint_seconds,
                )
            )
        if self.metrics.enabled:
            self._jobs.append(
                supervised.start(
                    "metrics", self._refresh_metrics, interval=self.settings.metrics_refresh_seconds
                )
            )
        if self.provider_health.probe is not None:
            self._jobs.append(
                supervised.start(
                    "provider-probe",
                    self.provider_health.probe_step,
                    interval=self.settings.provider_probe_seconds,
                )
            )
        if not self.settings.insecure:  # at start and daily: a cloud runs for months
            self._jobs.append(
                supervised.start(
                    "server-certificate", self._warn_of_expiry, interval=CERT_CHECK_INTERVAL_S
                )
            )
        await self.server.start()
        await _set_serving(self.health, True)
        self._jobs += [
            supervised.start(
                "database-probe",
                self.database.step,
                interval=self.settings.database_probe_interval_seconds,
                wake=self.database.wake,
                pause_first=True,
            ),
            supervised.start(
                "database-clock",
                self.database_clock.step,
                interval=DATABASE_CLOCK_CHECK_S,
                pause_first=True,  # checked at start, before anything held a lease by it
            ),
            supervised.start(
                "presence", self.presence.keep, interval=self.settings.host_heartbeat_seconds
            ),
            supervised.start(
                "revocations",
                self.revocations.refresh,
                interval=self.settings.revocation_refresh_seconds,
                wake=self._revocations_wake,
                pause_first=True,
            ),
        ]
        self._started = True

    async def _warn_of_expiry(self) -> None:
        """Warn when the server certificate expires within `EXPIRY_WARNING_DAYS` (the host's
        rule): once it has, every host and operator refuses it in the handshake, and the
        start-up check (`_listen_credentials`) only runs at the next start."""
        ca, cert, _ = self.settings.tls_paths()
        soon = cert_validity.expiry_warning(
            cert_validity.check(cert, ca, "server certificate"),
            f"the server certificate {cert}",
            "issue a new one with `amc certs init DIR` (it keeps the CA) and restart the cloud",
        )
        if soon:
            log.warning("%s", soon)

    async def _after_outage(self) -> None:
        """A replica that starts with no other alive starts after the whole cloud was down:
        live leases get a new term before the first sweep (`leases.extend_after_outage`).
        No stream of the replicas that died is open either: their hosts are disconnected until
        they say hello. Then this replica holds its own presence lock (`cloud.store.replicas`)."""
        asked = self.store.now()
        if not await self.presence.others_alive():
            extended = await leases.extend_after_outage(self.store)
            if extended:
                log.info("no other replica was up: %d live lease(s) get a new term", extended)
            await hosts.none_connected(self.store, asked)
        await self.presence.hold()

    async def stop(self, grace: float | None = None) -> None:
        """NOT_SERVING first, then end host streams, then stop the server within `grace`.

        Every step runs even when an earlier one raised (the first error is raised at the end):
        `stop` runs once, so a step that failed halfway must not leave the heartbeat, the
        sweeper or the database pool running behind a replica that says it stopped."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        first: BaseException | None = None

        async def step(action: Callable[[], Awaitable[object]]) -> None:
            nonlocal first
            try:
                await action()
            except Exception as exc:
                name = getattr(action, "__name__", action)
                errors.report(log, "stopping the replica: %s failed", exc, name)
                first = first or exc

        async def close_streams() -> None:
            self.leases.close_all(
                grpc.StatusCode.UNAVAILABLE, "server shutting down; reconnect", refuse_new=True
            )
            await self.leases.wait_streams_closed(max(grace, 1.0))

        async def stop_metrics_server() -> None:
            if self.metrics_server is not None:
                await asyncio.to_thread(self.metrics_server.stop)
                self.metrics_server = None

        async def close_owned() -> None:
            for closeable in self._closeables:
                with contextlib.suppress(Exception):
                    await closeable.aclose()
            if self._own_store:
                await self.store.close()

        async def finish_plans() -> None:
            """Plans whose Decide the stop cancelled end (logged) or are cut off (counted)
            while the planner and the database are still open."""
            await self._planner_servicer.finish_plans(max(grace, 1.0))

        await step(self.health.enter_graceful_shutdown)
        await step(close_streams)
        await step(lambda: self.server.stop(grace))
        await step(finish_plans)
        await step(self._progress.stop)  # watchers' shared reads, before the store closes
        await step(lambda: supervised.stop(self._jobs))
        await step(stop_metrics_server)
        await step(self.leases.stop)
        await step(self.bus.stop)
        await step(self.presence.release)
        await step(close_owned)
        if first is not None:
            raise first

    async def _refresh_metrics(self) -> None:
        s = self.settings
        await self.metrics.refresh(
            self.store, self.budgets.spend, s.daily_max_cost_usd, s.daily_max_tokens
        )

    async def wait(self) -> None:
        """Until the server terminates."""
        await self.server.wait_for_termination()

    async def prune_decisions(self) -> int:
        """One retention pass (also run on a schedule): decisions, session conversations and
        the markers of calls of unknown cost of tasks that ended more than the retention ago.
        Returns how many decisions went."""
        older_than = dt.timedelta(days=self.settings.retention_days)
        removed = await decisions.prune(
            self.store, older_than, batch_size=self.settings.retention_batch_size
        )
        items = await sessions.prune(
            self.store, older_than, batch_size=self.settings.retention_batch_size
        )
        if items:
            log.info("retention removed %d session items", items)
        calls = await unsettled.prune(self.store, older_than)
        if calls:
            log.info("retention removed %d markers of calls of unknown cost", calls)
        shots = await self.prune_screenshots(older_than)
        if shots:
            log.info("retention removed %d step screenshots", shots)
        return removed

    async def prune_screenshots(self, older_than: dt.timedelta) -> int:
        """Screenshots go with their decisions: the objects first, then their rows, so a store
        that fails midway leaves rows that the next pass deletes again (never orphan objects)."""
        removed = 0
        while True:
            batch = await screenshots.expired(
                self.store, older_than, limit=self.settings.retention_batch_size
            )
            if not batch:
                return removed
            await self.artifacts.delete([k for *_, key in batch for k in every_format(key)])
            await screenshots.forget(self.store, [(t, a, s, p) for t, a, s, p, _ in batch])
            removed += len(batch)

    async def _retention_pass(self) -> None:
        removed = await self.prune_decisions()
        if removed:
            log.info("retention removed %d decisions", removed)


async def build_server(
    settings: CloudSettings | None = None,
    store: Store | None = None,
    artifacts: ArtifactStore | None = None,
) -> CloudServer:
    """A bound cloud replica (call `start()`); `store` lets tests share one engine."""
    return CloudServer(settings or CloudSettings(), store, artifacts)


async def serve(settings: CloudSettings | None = None, say: Say | None = None) -> None:
    """Run one replica until SIGINT/SIGTERM, then shut down gracefully. `say` gets what it
    runs (address, store, planner, certificates) once it serves."""
    traced = tracing.configure("amc-cloud")
    server = await build_server(settings)
    server.tracing = traced
    await server.start()
    server.serve_metrics()
    collector = gc_policy.start(server.settings.gc_freeze_seconds, server.settings.gc_thaw_seconds)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    for line in server.describe():  # after the handlers: whoever reads it may stop us at once
        (say or log.info)(line)
    waiter = asyncio.create_task(server.wait())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    (say or log.info)("amc cloud stopping")
    await server.stop()
    if collector is not None:
        await supervised.stop([collector])
    for t in (waiter, stopper):
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
