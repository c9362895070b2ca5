"""Settings of the host's local console (env prefix `AMC_HOST_CONSOLE_`).

Kept apart from `HostSettings` so the host runs the same with or without a console, and so the
console's one dangerous switch (`allow_remote`) sits next to the address it guards.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from telemetry.redaction import KeepsSecrets
from webui.hosts import host_list


class HostConsoleSettings(KeepsSecrets, BaseSettings):
    """Where the local console listens and how its sessions are signed."""

    model_config = SettingsConfigDict(env_prefix="AMC_HOST_CONSOLE_", extra="ignore")

    #: Loopback by default: the console shows screenshots and prompts of this host's phones.
    bind_host: str = "127.0.0.1"
    bind_port: int = Field(default=8765, ge=0, le=65535)
    #: Required to listen on anything but a loopback address (`--allow-remote`).
    allow_remote: bool = False
    #: Host names browsers may use for the console besides the loopback ones (a rebinding
    #: guard, `webui.hosts`): comma-separated, `*` for any; with `allow_remote` and no names
    #: given, any Host header is accepted.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Signs the session cookie; a random one (sessions end with the process) when unset.
    session_secret: SecretStr = Field(default_factory=lambda: SecretStr(secrets.token_urlsafe(32)))
    session_max_age_s: int = Field(default=12 * 3600, gt=0)
    #: Send the session cookie over HTTPS only (set it when a TLS proxy is in front).
    cookie_secure: bool = False
    #: How often the "now" page asks for fresh progress (at most once a second by design).
    poll_interval_s: float = Field(default=1.0, gt=0, le=1.0)
    #: Tasks per page on the task list.
    page_size: int = Field(default=50, ge=1, le=500)
    #: uvicorn's log level for the console's own server.
    log_level: str = "warning"
    #: Folder of the one-time tokens `amc host token` issues (and of the console's URL, for
    #: it to print); by default `<AMC_HOST_DATA_DIR>/console-tokens` of the host it serves.
    token_dir: Path | None = None

    _host_list = field_validator("allowed_hosts", mode="before")(host_list)

    @model_validator(mode="after")
    def _check_secret(self) -> HostConsoleSettings:
        if len(self.session_secret.get_secret_value()) < 16:
            raise ValueError("AMC_HOST_CONSOLE_SESSION_SECRET must be at least 16 characters")
        return self
