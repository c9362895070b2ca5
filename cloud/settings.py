"""Settings of a cloud replica (env prefix `AMC_CLOUD_`), the error a bad one raises, and the
one line any part's settings error becomes (`validation_problem`).

docs/deployment.md lists every field here as `AMC_CLOUD_<NAME>` (a test keeps the two in step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import AliasChoices, Field, SecretBytes, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

# Re-exported: host settings and tests name it here.
from cloud.default_address import DEFAULT_CLOUD_ADDRESS as DEFAULT_CLOUD_ADDRESS
from cloud.store.pool import DEFAULT_POOL_SIZE, MIN_POOL_SIZE
from telemetry.redaction import KeepsSecrets

#: Where `amc cloud serve` serves Prometheus metrics unless told otherwise (loopback: a
#: Prometheus on another machine needs AMC_CLOUD_METRICS_ADDRESS=0.0.0.0:9471).
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9471"


class SettingError(ValueError):
    """A setting keeps the cloud from starting: which one, what is wrong, how to fix it.

    `amc cloud serve` prints `str(error)` as its one line (no traceback unless --debug).
    """

    def __init__(self, setting: str, problem: str, fix: str) -> None:
        super().__init__(f"{setting}: {problem}; {fix}")
        self.setting = setting


#: Words of a field's name that say it holds a secret (`api_token`, `secrets_key`): its value is
#: never shown, whatever its type (`max_tokens` is no token).
_SECRET_WORDS = frozenset({"key", "token", "password", "secret"})


def _settings_class(name: str) -> type[BaseSettings] | None:
    """The settings class a validation error names (its title), among those imported: the
    class that raised it is. Each class's prefix is its own `env_prefix`, not a table kept
    beside it (which missed `AMC_LOG_` once)."""
    classes: list[type[BaseSettings]] = list(BaseSettings.__subclasses__())
    while classes:
        found = classes.pop()
        if found.__name__ == name:
            return found
        classes.extend(found.__subclasses__())
    return None


def _holds_secret(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, SecretStr | SecretBytes):
        return True
    return any(_holds_secret(arg) for arg in get_args(annotation))


def _aliases(field: FieldInfo) -> set[str]:
    chosen = field.validation_alias
    names = set(chosen.choices) if isinstance(chosen, AliasChoices) else {chosen}
    return {n for n in (*names, field.alias) if isinstance(n, str)}


def validation_problem(error: ValidationError) -> tuple[str, str]:
    """pydantic's first complaint about a settings class, as (the problem, naming the variable
    that caused it; how to fix it): the one wording of `amc cloud serve` and every other `amc`
    command. A field's value is quoted (`got '…'`) unless it may be a secret: a `SecretStr`, or
    a name that says so (`_SECRET_WORDS`)."""
    first = error.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:  # a check across settings: its message names the variables
        return message, "fix the variables or unset them to use the defaults"
    settings = _settings_class(error.title)
    fields = settings.model_fields if settings is not None else {}
    name = str(first["loc"][0])
    variable = ".".join(str(part) for part in first["loc"]).upper()
    field = fields.get(name)
    if field is None:  # named by its alias, which is the variable itself
        field = next((f for f in fields.values() if name in _aliases(f)), None)
    elif settings is not None:
        variable = str(settings.model_config.get("env_prefix", "")) + variable
    secret = bool(_SECRET_WORDS & set(name.lower().split("_"))) or (
        field is not None and _holds_secret(field.annotation)
    )
    value = first.get("input")
    got = f" (got {value!r})" if isinstance(value, str | int | float) and not secret else ""
    return f"{variable}: {message}{got}", "fix the variable or unset it to use the default"


def port_in_range(address: str) -> str:
    """`address` (`host:port`, or any gRPC target) unless its port is a number no socket can
    have: gRPC bound `127.0.0.1:-1` as port 65535, and socket's OverflowError for 99999 was
    "unexpected" with a traceback of gRPC's on top."""
    port = address.strip().rpartition(":")[2]
    if port.lstrip("-").isdigit() and not 0 <= int(port) <= 65535:
        raise ValueError(f"port {port} is out of range (0 to 65535)")
    return address


class CloudSettings(KeepsSecrets, BaseSettings):
    """Everything a cloud replica reads at start. Durations are in seconds."""

    model_config = SettingsConfigDict(env_prefix="AMC_CLOUD_", extra="ignore")

    database_url: str = "sqlite+aiosqlite:///amc-cloud.sqlite3"
    #: PostgreSQL: the most pooled connections this replica opens (`cloud.store.pool`); every
    #: replica's counts against the server's max_connections.
    database_pool_size: int = DEFAULT_POOL_SIZE
    listen_address: str = DEFAULT_CLOUD_ADDRESS
    # mTLS material; pki_dir fills in any path left empty using the standard file names.
    pki_dir: Path | None = None
    ca_cert: Path | None = None
    server_cert: Path | None = None
    server_key: Path | None = None
    # Plaintext, allowed only on a loopback listen address. Never the default.
    insecure: bool = False

    # Task and lease defaults (per task overridable through SubmitTask).
    default_lease_seconds: float = Field(30.0, gt=0)
    min_lease_seconds: float = Field(5.0, gt=0)
    max_lease_seconds: float = Field(3600.0, gt=0)
    default_max_attempts: int = Field(3, ge=1, le=20)
    default_timeout_seconds: float = Field(3600.0, gt=0)

    # Background jobs.
    sweep_interval_seconds: float = Field(1.0, gt=0)
    dispatch_interval_seconds: float = Field(2.0, gt=0)
    renewal_batch_window_seconds: float = Field(0.005, ge=0)
    renewal_batch_max: int = Field(500, ge=1)
    # A renewal is written to the store when its lease has less than this fraction of its length
    # left (or its progress changed, or its attempt is not yet running); otherwise it is answered
    # with the stored expiry after a read. 1 = every renewal writes. The default keeps what a
    # written renewal promised: hosts renew every third of a lease, and 0.85 - 1/3 > 1/2, so after
    # a renewal answered from a read the lease still outlives a lost renewal, or a database outage
    # of half a lease. See decision 0070.
    renewal_write_below: float = Field(0.85, gt=0, le=1)
    host_heartbeat_seconds: float = Field(10.0, gt=0)
    # A gap this long in the replica's time (its wall clock stepped forward, or it stood still)
    # counts as an outage: with no other replica alive, live leases get a new term before any
    # renewal, result or sweep is held against the clock (cloud/lease/clock.py). Hosts renew
    # every third of a lease, so a smaller gap costs no lease.
    clock_gap_seconds: float = Field(5.0, gt=0)
    retention_days: float = Field(7.0, gt=0)
    retention_interval_seconds: float = Field(3600.0, gt=0)
    # The model provider counts as down for everyone after this many Decide calls in a row
    # found planning temporarily impossible: dispatch to cloud-transport hosts pauses until a
    # probe call (every `provider_probe_seconds`, backing off while it fails) succeeds.
    provider_down_after_failures: int = Field(3, ge=1)
    provider_probe_seconds: float = Field(5.0, gt=0)
    retention_batch_size: int = Field(1000, ge=1)
    #: How often the database is probed for the health service (sooner after a failed call).
    database_probe_interval_seconds: float = Field(2.0, gt=0)
    #: SQLite: how often the WAL is copied into the database file (`Store.checkpoint`).
    sqlite_checkpoint_seconds: float = Field(1.0, gt=0)
    #: How often the certificate deny-list is reloaded anyway (on PostgreSQL a revocation is
    #: announced at once; this bounds how late a lost announcement, or SQLite, can be).
    revocation_refresh_seconds: float = Field(10.0, gt=0)

    # Learned flows (docs/decisions/0050-…): an attempt that succeeded on the cloud transport
    # becomes a flow; a new task whose goal scores at least `flow_threshold` against one gets
    # it with its assignment and replays it without the model. `flow_scorer` "lexical" needs no
    # model; "openai" embeds goals and flows with the OpenAI embeddings API (the planner's
    # OpenAI key, AMC_PLANNER_OPENAI_API_KEY / OPENAI_API_KEY) and falls back to lexical when a
    # call fails. A flow that diverged on `flow_retire_after` attempts in a row is retired.
    flows_enabled: bool = True
    flow_threshold: float = Field(0.8, gt=0, le=1)
    flow_scorer: Literal["lexical", "openai"] = "lexical"
    flow_embedding_model: str = "text-embedding-3-small"
    flow_retire_after: int = Field(3, ge=1)
    flow_learning_interval_seconds: float = Field(2.0, gt=0)

    # Transport liveness (separate from leases).
    keepalive_time_seconds: float = Field(30.0, gt=0)
    keepalive_timeout_seconds: float = Field(10.0, gt=0)
    min_client_ping_interval_seconds: float = Field(10.0, gt=0)
    max_connection_age_seconds: float = Field(1800.0, gt=0)
    max_connection_age_grace_seconds: float = Field(60.0, gt=0)
    max_message_bytes: int = Field(16 * 1024 * 1024, gt=0)
    # A Lease stream whose hello has not arrived this long after it opened is ended
    # (DEADLINE_EXCEEDED): a client that opens streams and says nothing holds none for long.
    hello_timeout_seconds: float = Field(30.0, gt=0)
    # A message to a host that its stream has not taken this long after it was written (the
    # client stopped reading and its flow-control window is full) ends that stream
    # (UNAVAILABLE "not reading"): the write held the session's write lock, and a supersede
    # or a revocation could not end the stream until the connection's maximum age. One watch
    # per replica looks for such writes every second (four times within a shorter limit):
    # `cloud.lease.write_watch`.
    lease_write_timeout_seconds: float = Field(10.0, gt=0)
    shutdown_grace_seconds: float = Field(5.0, ge=0)

    # Secret parameters of tasks (cloud/secret_box.py): Fernet keys, comma separated (the first
    # encrypts, all decrypt), or a file holding them. Without one, SubmitTask refuses secrets
    # (FAILED_PRECONDITION) rather than store them in plain text.
    secrets_key: SecretStr | None = None
    secrets_key_file: Path | None = None

    # Migrations at start (the CLI may run them separately and turn this off).
    migrate_on_start: bool = True

    # Step screenshots: where their bytes live ("directory" or "s3"; never the database).
    artifact_store: Literal["directory", "s3"] = "directory"
    # Empty: beside a SQLite database file (`<name>-artifacts`), else ./amc-cloud-artifacts.
    artifact_dir: Path | None = None
    artifact_s3_bucket: str = ""
    # Empty: AWS itself; a URL for any S3-compatible server (MinIO, SeaweedFS, Ceph …).
    artifact_s3_endpoint_url: str = ""
    artifact_s3_region: str = ""
    # Keys inside the bucket start with this ("amc/" keeps a shared bucket tidy).
    artifact_s3_prefix: str = ""
    # Empty: boto3's usual credential chain (AWS_* variables, shared config, instance role).
    artifact_s3_access_key_id: str = ""
    artifact_s3_secret_access_key: SecretStr = SecretStr("")
    # How long after an attempt ended its host may still ship that attempt's decisions and
    # screenshots (a host that was offline sends its backlog when it is back).
    ship_window_seconds: float = Field(86400.0, gt=0)

    @property
    def resolved_artifact_dir(self) -> Path:
        """`artifact_dir`, or the default: beside a SQLite file, else in the working folder."""
        if self.artifact_dir is not None:
            return self.artifact_dir
        # Here, not at the top: hosts import this module for its defaults, and SQLAlchemy
        # would cost each of them ~1.5 s at start.
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        from cloud.store.sqlite_file import sqlite_file

        try:
            url = make_url(self.database_url)
        except ArgumentError:  # its text names no part of the URL (which may hold a password)
            raise SettingError(
                "AMC_CLOUD_DATABASE_URL",
                "not a database URL (SQLAlchemy cannot parse it)",
                "use sqlite+aiosqlite:///path.sqlite3 or postgresql+psycopg://user:pass@host/db",
            ) from None
        db = sqlite_file(url)
        if db is not None:
            return db.with_name(f"{db.stem}-artifacts")
        return Path("amc-cloud-artifacts")

    def check_ship_window(self) -> None:
        """A shipping window longer than the retention is a SettingError (checked at start)."""
        if self.ship_window_seconds > self.retention_days * 86400:
            raise SettingError(
                "AMC_CLOUD_SHIP_WINDOW_SECONDS",
                f"{self.ship_window_seconds:.0f} s is longer than the decision log's retention "
                f"(AMC_CLOUD_RETENTION_DAYS={self.retention_days:g})",
                "a host could ship decisions of tasks already pruned: shorten the window",
            )

    # Observability (docs/operations.md). Where `amc cloud serve` serves Prometheus metrics
    # (`host:port`; "off" turns the endpoint off; the embedded stack serves none unless asked),
    # whether the metrics are kept at all (off only to measure what they cost), and how often
    # the gauges read from the database (tasks by status, queue depth) are refreshed.
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    metrics_enabled: bool = True
    metrics_refresh_seconds: float = Field(15.0, gt=0)
    # The garbage collector (`cloud.gc_policy`, `amc cloud serve` only): how often objects that
    # survived are frozen out of its full passes (0: CPython's own policy), and how often
    # everything is thawed for one full collection that reclaims frozen garbage.
    gc_freeze_seconds: float = Field(1.0, ge=0)
    gc_thaw_seconds: float = Field(900.0, gt=0)

    # Spending caps (docs/operations.md, "Cost and budgets"); 0 = no cap. A task's own caps
    # default to these when SubmitTask leaves them 0; the daily ones bound the whole fleet's
    # model spending per UTC day (decisions on the cloud transport).
    default_task_max_tokens: int = Field(0, ge=0)
    default_task_max_cost_usd: float = Field(0.0, ge=0)
    daily_max_tokens: int = Field(0, ge=0)
    daily_max_cost_usd: float = Field(0.0, ge=0)

    _listen_port = field_validator("listen_address")(port_in_range)

    @field_validator("database_pool_size")
    @classmethod
    def _pool_size(cls, size: int) -> int:
        """Refused below what the cloud's own jobs may hold at once (`MIN_POOL_SIZE`), naming
        that minimum: a smaller pool starved the calls behind them until they timed out."""
        if size < MIN_POOL_SIZE:
            raise ValueError(
                f"must be at least {MIN_POOL_SIZE}: the cloud's background jobs (sweeps,"
                " dispatch, the database probe, the deny-list and metrics refreshes) may each"
                " hold a pooled connection at once, and calls need one more"
            )
        return size

    def tls_paths(self) -> tuple[Path, Path, Path]:
        """(ca, server cert, server key), filled from `pki_dir` where not given explicitly."""
        base = self.pki_dir
        ca = self.ca_cert or (base / "ca.pem" if base else None)
        cert = self.server_cert or (base / "server.pem" if base else None)
        key = self.server_key or (base / "server.key" if base else None)
        if ca is None or cert is None or key is None:
            raise SettingError(
                "AMC_CLOUD_PKI_DIR",
                "mTLS needs certificates and none are set (nor AMC_CLOUD_CA_CERT, "
                "AMC_CLOUD_SERVER_CERT and AMC_CLOUD_SERVER_KEY)",
                "run `amc certs init DIR` and set AMC_CLOUD_PKI_DIR=DIR (or AMC_CLOUD_INSECURE=1 "
                "for plaintext on loopback, never in production)",
            )
        return ca, cert, key

    def tls_source(self) -> str:
        """Where the certificates come from, for the start-up banner."""
        if self.insecure:
            return "none (AMC_CLOUD_INSECURE: plaintext)"
        ca, cert, key = self.tls_paths()
        if self.pki_dir is not None and (ca, cert, key) == (
            self.pki_dir / "ca.pem",
            self.pki_dir / "server.pem",
            self.pki_dir / "server.key",
        ):
            return f"AMC_CLOUD_PKI_DIR={self.pki_dir} (ca.pem, server.pem, server.key)"
        return f"CA {ca}, server certificate {cert}, key {key}"

    def read_tls_file(self, path: Path) -> bytes:
        """A certificate or key file, or a SettingError naming the setting it came from."""
        try:
            return path.read_bytes()
        except OSError as exc:
            explicit = {
                self.ca_cert: "AMC_CLOUD_CA_CERT",
                self.server_cert: "AMC_CLOUD_SERVER_CERT",
                self.server_key: "AMC_CLOUD_SERVER_KEY",
            }
            setting = explicit.get(path, "AMC_CLOUD_PKI_DIR")
            raise SettingError(
                setting,
                f"cannot read {path} ({exc.strerror or exc})",
                "point it at the files `amc certs init` wrote",
            ) from exc
