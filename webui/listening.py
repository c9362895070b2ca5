"""Whether a console's listen address reaches only this machine (loopback): both consoles ask
before serving what they show (phone screens, prompts, a login) on any other address."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address (unresolvable: False)."""
    name = host.strip().strip("[]")
    if not name:
        return False
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(a).split("%", 1)[0]).is_loopback for a in addresses
    )


def is_wildcard(host: str) -> bool:
    """True for an address that listens on every interface (`0.0.0.0`, `::`, empty): a console
    bound so is reached by names and addresses it cannot know in advance."""
    name = host.strip().strip("[]")
    if not name:
        return True
    try:
        return ipaddress.ip_address(name).is_unspecified
    except ValueError:
        return False
