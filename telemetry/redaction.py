"""What no log line, span or status may carry: every configured secret and credential headers.

A secret reaches text in ways no caller controls: a provider echoes a key (partly masked) in a
401 message, a proxy in front of the API quotes the request's headers in its error body, a
library quotes the URL it could not reach, and that text travels in the exception into planner
errors, tracebacks and statuses. So every secret a process is configured with is kept here as
its settings are read, whatever its shape: each settings class is a `KeepsSecrets`, which keeps
its `SecretStr` fields and the password of any URL it holds (`AMC_CLOUD_DATABASE_URL`'s), and
the API keys are kept as clients are made (`keep_secret`). `scrub` replaces them, the values of
credential headers (`Authorization: Bearer …`, `x-api-key: …`), a URL's password and anything
that looks like a provider key (`sk-…`, `key-…`) wherever text leaves the process: every log
line written through `telemetry.logs`, every planner error, every `amc` error line.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pydantic import SecretBytes, SecretStr

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

MASK = "•••"

#: Shorter values are not kept: replacing a 4-character string everywhere would garble every
#: log line that happens to contain it, and no provider issues keys that short.
MIN_SECRET_LENGTH = 8

_secrets: set[str] = set()

#: Key-like tokens (`sk-…`, `sk-ant-…`, also the partly masked `sk-abc***xyz` some providers echo
#: back in a 401 message).
_KEY_LIKE = re.compile(r"\b(sk|key)-[A-Za-z0-9_*.\-]{4,}")
#: A credential header's value as a proxy, an SDK or a dict's repr quotes it: `Authorization:
#: Bearer x`, `'x-api-key': 'x'`, `\"api-key\": \"x\"` (inside a JSON log line).
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-api-key|api-key|x-goog-api-key)"
    r"([\\\"']*\s*[:=]\s*[\\\"']*)((?:bearer|basic)\s+)?(?:[A-Za-z0-9._~+/=*\-]|•)+"
)
#: A bearer token quoted without its header's name.
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
#: A URL's password (`postgresql+psycopg://amc:PASSWORD@db/amc`), up to the last `@` before the
#: host: a password generated with `@`, `/` or `:` in it (percent-encoded or not) goes too.
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@'\"]*:)[^\s'\"]*@")
#: A password given as a URL's query parameter (`postgresql+psycopg://amc@db/amc?password=…`,
#: libpq's and SQLAlchemy's other spelling, which some secret managers emit; `sslpassword` is
#: the client key's passphrase): SQLAlchemy's `hide_password` hides only the userinfo one.
_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:ssl)?password=)(?!•••)[^&#\s'\"]+")
_QUERY_SECRETS = frozenset({"password", "sslpassword"})


def keep_secret(value: str) -> None:
    """From now on, `scrub` replaces `value` (a configured key, password or token) wherever it
    appears."""
    if len(value) >= MIN_SECRET_LENGTH:
        _secrets.add(value)


def keep_settings(settings: object) -> None:
    """Keep every secret a settings object holds: its `SecretStr` (and `SecretBytes`) fields,
    and the password of each URL it holds, as written and percent-decoded (a library quotes
    either). Read from the fields' values, not from a list kept beside the classes."""
    for value in vars(settings).values():
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, SecretStr):
                keep_secret(item.get_secret_value())
            elif isinstance(item, SecretBytes):
                keep_secret(item.get_secret_value().decode("utf-8", "replace"))
            elif isinstance(item, str) and "://" in item:
                _keep_url_password(item)


def _keep_url_password(url: str) -> None:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL after all (a port that is no number)
        return
    passwords = [password] if password else []
    # As written (percent-encoded or not); `unquote` below keeps the decoded form too.
    passwords += [m[0].split("=", 1)[1] for m in _QUERY_PASSWORD.finditer("?" + parts.query)]
    for value in passwords:
        keep_secret(value)
        keep_secret(unquote(value))


def shown_url(url: URL) -> str:
    """`url` as a person may see it (a banner, an error line): no password, neither the
    userinfo one nor one given as a query parameter."""
    hidden = {key: "" for key in url.query if key.lower() in _QUERY_SECRETS}
    shown = url.update_query_dict(hidden).render_as_string(hide_password=True)
    # Exact, by name (a password may hold `:` or `@`, which the free-text pattern cannot
    # tell from the text around it); the mask written in after rendering, unencoded.
    for key in hidden:
        shown = shown.replace(f"{key}=", f"{key}={MASK}", 1)
    return shown


class KeepsSecrets:
    """A settings class whose secrets are kept (`keep_settings`) as soon as it is read: every
    process reads its settings before it writes a line."""

    def model_post_init(self, context: Any, /) -> None:
        keep_settings(self)


def scrub(text: str) -> str:
    """`text` without the kept secrets, credential header values, or anything key-like."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _HEADER.sub(lambda m: f"{m[1]}{m[2]}{m[3] or ''}{MASK}", text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    text = _QUERY_PASSWORD.sub(rf"\1{MASK}", text)
    return _KEY_LIKE.sub(rf"\1-{MASK}", text)
