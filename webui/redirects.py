"""Where a login may send a person next: only to a path on this site."""

from __future__ import annotations

from urllib.parse import urlencode


def safe_next(target: str, fallback: str) -> str:
    """`target` if it is a same-site path, else `fallback`, so a crafted login link cannot
    bounce a person to another site (`//evil.example`, `https://…`, `/\\evil.example`)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return fallback


def login_url(next_path: str) -> str:
    """The login page, coming back to `next_path` afterwards."""
    return "/login?" + urlencode({"next": next_path})
