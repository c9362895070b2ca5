"""Where the local console may listen: loopback, unless the operator explicitly says otherwise.

A host console shows screenshots of real phones and the prompts sent about them, so listening
on a public interface by accident (`0.0.0.0` in a config file copied from elsewhere) must fail
loudly at start rather than quietly expose it.
"""

from __future__ import annotations

from webui.listening import is_loopback

__all__ = ["RemoteBindRefused", "check_bind_address", "is_loopback"]


class RemoteBindRefused(ValueError):
    """The console was asked to listen on a non-loopback address without `allow_remote`."""


def check_bind_address(host: str, allow_remote: bool) -> None:
    """Raise `RemoteBindRefused` unless `host` is loopback or `allow_remote` is set."""
    if allow_remote or is_loopback(host):
        return
    raise RemoteBindRefused(
        f"the host console will not listen on {host!r}: it is not a loopback address and the "
        "console shows phone screens and prompts. Bind 127.0.0.1 (the default), or pass "
        "--allow-remote (AMC_HOST_CONSOLE_ALLOW_REMOTE=true) if you really mean to expose it."
    )
