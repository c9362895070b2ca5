"""Encryption at rest of tasks' secret parameters (Fernet: AES-128-CBC + HMAC-SHA256).

The cloud keeps a task's secrets from submission until the task ends, encrypted with a key from
its settings (`AMC_CLOUD_SECRETS_KEY`, or a file named by `AMC_CLOUD_SECRETS_KEY_FILE`). Several
keys may be given, comma separated: the first encrypts, every one decrypts (rotation: put the
new key first, keep the old one until the tasks submitted under it have ended). A cloud without
a key refuses secrets at submit (FAILED_PRECONDITION) rather than store them in plain text;
every replica of a fleet needs the same keys. `cryptography`'s Fernet is used as is: a
timestamped, authenticated token, so a tampered row fails to decrypt instead of typing garbage.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from cloud.settings import SettingError
from telemetry.redaction import keep_secret

#: What SubmitTask answers when the cloud has no key (FAILED_PRECONDITION).
NO_KEY = (
    "this cloud has no secrets key, and it never stores a secret in plain text: set "
    "AMC_CLOUD_SECRETS_KEY (or AMC_CLOUD_SECRETS_KEY_FILE) on every replica — `amc certs "
    "secrets-key` prints a new one — or submit the task without secrets"
)


class SecretUnreadable(Exception):
    """A stored secret does not decrypt with any configured key (the key was changed)."""


class SecretBox:
    """Encrypts and decrypts secret values with the configured Fernet keys."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ValueError("at least one key")
        self._fernet = MultiFernet([Fernet(k) for k in keys])

    def seal(self, value: str) -> str:
        """The value as a Fernet token (ASCII), what the database stores."""
        return self._fernet.encrypt(value.encode("utf-8")).decode("ascii")

    def open(self, token: str) -> str:
        """The value of a stored token; `SecretUnreadable` when no key decrypts it."""
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, ValueError) as exc:
            raise SecretUnreadable(
                "a stored secret does not decrypt with any configured key"
            ) from exc


def new_key() -> str:
    """A fresh key for `AMC_CLOUD_SECRETS_KEY`."""
    return Fernet.generate_key().decode("ascii")


def from_settings(key: str | None, key_file: Path | None) -> SecretBox | None:
    """The box for the configured keys, None when none is configured; a `SettingError` for a
    key that is not a Fernet key (32 url-safe base64-encoded bytes) or an unreadable file."""
    setting = "AMC_CLOUD_SECRETS_KEY"
    text = key
    if text is None and key_file is not None:
        setting = "AMC_CLOUD_SECRETS_KEY_FILE"
        try:
            text = key_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingError(
                setting, f"cannot read {key_file} ({exc.strerror or exc})", "point it at a key file"
            ) from exc
    if text is None or not text.strip():
        return None
    keys = [k.strip().encode("ascii", "replace") for k in text.split(",") if k.strip()]
    for found in keys:  # a key file's keys are no setting's value: kept here
        keep_secret(found.decode("ascii"))
    try:
        return SecretBox(keys)
    except ValueError as exc:
        raise SettingError(
            setting,
            "not a list of Fernet keys (each 32 url-safe base64-encoded bytes)",
            "make one with `amc certs secrets-key`",
        ) from exc
