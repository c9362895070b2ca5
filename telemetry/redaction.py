"""What no log line, span or status may carry: the configured API keys and credential headers.

A key reaches text in ways no caller controls: a provider echoes it (partly masked) in a 401
message, a proxy in front of the API quotes the request's headers in its error body, and that
text travels in the SDK's exception into planner errors, tracebacks and statuses. So the keys
the process was configured with are kept here as they are read (`keep_secret`), whatever their
shape, and `scrub` replaces them, the values of credential headers (`Authorization: Bearer …`,
`x-api-key: …`) and anything that looks like a provider key (`sk-…`, `key-…`) wherever text
leaves the process: every log line written through `telemetry.logs`, every planner error.
"""

from __future__ import annotations

import re

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


def keep_secret(value: str) -> None:
    """From now on, `scrub` replaces `value` (a configured API key) wherever it appears."""
    if len(value) >= MIN_SECRET_LENGTH:
        _secrets.add(value)


def scrub(text: str) -> str:
    """`text` without the kept secrets, credential header values, or anything key-like."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _HEADER.sub(lambda m: f"{m[1]}{m[2]}{m[3] or ''}{MASK}", text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    return _KEY_LIKE.sub(rf"\1-{MASK}", text)
