"""Settings of the cloud console gateway (env prefix `AMC_CONSOLE_`).

The gateway is a client of the cloud like any other operator tool: it needs the cloud's address
and an operator certificate. On top of that it serves people, so it also needs the operators'
login, a secret to sign session cookies and, for scripts, a bearer token for the JSON API; and,
for people who only watch, a viewer login and token.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cloud.settings import DEFAULT_CLOUD_ADDRESS
from telemetry.redaction import KeepsSecrets
from webui.hosts import host_list


class ConsoleSettings(KeepsSecrets, BaseSettings):
    """Configuration of one console gateway process."""

    model_config = SettingsConfigDict(env_prefix="AMC_CONSOLE_", extra="ignore")

    # --- the cloud it talks to ---
    cloud_address: str = DEFAULT_CLOUD_ADDRESS
    #: Folder with `ca.pem`, `operator-<name>.pem` and `operator-<name>.key` (as `cloud/pki.py`
    #: writes them); the explicit paths below win over it.
    certs_dir: Path | None = None
    #: Operator name of the gateway's own certificate (`amc://operator/<name>`).
    operator_name: str = "console"
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    #: TLS name to check on the server certificate (server certs carry DNS `localhost`).
    tls_server_name: str | None = None
    #: Deadline of each unary call to the cloud.
    grpc_timeout_s: float = Field(default=10.0, gt=0)
    #: While the cloud is unreachable the gateway tries again after `reconnect_initial_s`, the
    #: wait growing to at most `reconnect_max_s`: gRPC's own default grows to two minutes, and a
    #: restarted cloud went on getting 503s from the gateway that long.
    reconnect_initial_s: float = Field(default=0.5, gt=0)
    reconnect_max_s: float = Field(default=5.0, gt=0)

    # --- who may use it ---
    admin_username: str = "admin"
    admin_password: SecretStr
    #: Signs the session cookie; a random one (sessions end with the process) when unset.
    session_secret: SecretStr = Field(default_factory=lambda: SecretStr(secrets.token_urlsafe(32)))
    session_max_age_s: int = Field(default=12 * 3600, gt=0)
    #: Send the session cookie over HTTPS only. Unset: on exactly when the console serves TLS
    #: itself (`tls_cert_file`); set it to true behind a TLS-terminating proxy.
    cookie_secure: bool | None = None
    #: `Authorization: Bearer <token>` for the JSON API; unset disables bearer access.
    api_token: SecretStr | None = None
    #: A viewer login (both or neither): sees every page and read, may change nothing
    #: (`console.gateway.roles`). Its name must differ from the operator's.
    viewer_username: str | None = None
    viewer_password: SecretStr | None = None
    #: A bearer token for the JSON API's reads only; unset: none.
    viewer_api_token: SecretStr | None = None

    # --- where it listens ---
    bind_host: str = "127.0.0.1"
    bind_port: int = Field(default=8080, ge=0, le=65535)
    #: Host names browsers may reach the console by, besides its loopback names and bind
    #: address (comma-separated; `*`: any). Any other Host header is refused (400), so a web
    #: page that re-points its own domain at the console's address (DNS rebinding) cannot
    #: use it through an operator's browser (`webui.hosts`).
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Serve HTTPS with this certificate chain (PEM) and key; both or neither.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    _host_list = field_validator("allowed_hosts", mode="before")(host_list)

    @property
    def secure_cookies(self) -> bool:
        """Whether the session cookie carries `Secure` (HTTPS only)."""
        return self.cookie_secure if self.cookie_secure is not None else self.serves_tls

    @property
    def serves_tls(self) -> bool:
        """Whether the console itself serves HTTPS."""
        return self.tls_cert_file is not None

    @model_validator(mode="after")
    def _fill_cert_paths(self) -> ConsoleSettings:
        """Derive the certificate paths from `certs_dir` where they were not given."""
        if self.certs_dir is not None:
            if self.ca_cert is None:
                self.ca_cert = self.certs_dir / "ca.pem"
            if self.client_cert is None:
                self.client_cert = self.certs_dir / f"operator-{self.operator_name}.pem"
            if self.client_key is None:
                self.client_key = self.certs_dir / f"operator-{self.operator_name}.key"
        return self

    @model_validator(mode="after")
    def _check_secrets(self) -> ConsoleSettings:
        """Refuse empty secrets: an empty password or token would let anyone in."""
        if not self.admin_password.get_secret_value():
            raise ValueError("AMC_CONSOLE_ADMIN_PASSWORD must not be empty")
        if self.api_token is not None and len(self.api_token.get_secret_value()) < 16:
            raise ValueError("AMC_CONSOLE_API_TOKEN must be at least 16 characters")
        if (self.viewer_username is None) != (self.viewer_password is None):
            raise ValueError(
                "set both AMC_CONSOLE_VIEWER_USERNAME and AMC_CONSOLE_VIEWER_PASSWORD, or neither"
            )
        if self.viewer_password is not None and not self.viewer_password.get_secret_value():
            raise ValueError("AMC_CONSOLE_VIEWER_PASSWORD must not be empty")
        if self.viewer_username is not None and self.viewer_username == self.admin_username:
            # A session holds only the user's name: one name for both would make it both.
            raise ValueError(
                "AMC_CONSOLE_VIEWER_USERNAME must differ from AMC_CONSOLE_ADMIN_USERNAME"
            )
        if self.viewer_api_token is not None:
            token = self.viewer_api_token.get_secret_value()
            if len(token) < 16:
                raise ValueError("AMC_CONSOLE_VIEWER_API_TOKEN must be at least 16 characters")
            if self.api_token is not None and token == self.api_token.get_secret_value():
                raise ValueError(
                    "AMC_CONSOLE_VIEWER_API_TOKEN must differ from AMC_CONSOLE_API_TOKEN"
                )
        if len(self.session_secret.get_secret_value()) < 16:
            raise ValueError("AMC_CONSOLE_SESSION_SECRET must be at least 16 characters")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "set both AMC_CONSOLE_TLS_CERT_FILE and AMC_CONSOLE_TLS_KEY_FILE, or neither"
            )
        return self

    @property
    def viewer_account(self) -> tuple[str, SecretStr] | None:
        """The viewer login (name, password), when there is one."""
        if self.viewer_username is None or self.viewer_password is None:
            return None
        return self.viewer_username, self.viewer_password

    def tls_files(self) -> tuple[Path, Path, Path]:
        """(ca, cert, key) of the operator identity; raises when any is missing."""
        if self.ca_cert is None or self.client_cert is None or self.client_key is None:
            raise ValueError(
                "the console needs an operator certificate: set AMC_CONSOLE_CERTS_DIR or "
                "AMC_CONSOLE_CA_CERT, AMC_CONSOLE_CLIENT_CERT and AMC_CONSOLE_CLIENT_KEY"
            )
        return self.ca_cert, self.client_cert, self.client_key
