"""Port forwarding for the virtual adb server: `adb forward` and `adb reverse` as a real server
keeps them.

`forward:tcp:LOCAL;tcp:REMOTE` listens on LOCAL on the host's loopback and joins each
connection to the phone's REMOTE port (a server running on the phone, such as uiutomator2's
agent); a connection to a phone port nothing listens on is closed at once, as adbd closes it.
`reverse:` rules are kept and listed; nothing on a virtual phone ever connects through them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from host.devices.virtual.phone import VirtualPhone


@dataclass
class Forward:
    serial: str
    local: str
    remote: str
    server: asyncio.Server
    #: The connections it carries now: asyncio's `Server.close()` leaves accepted connections
    #: open (before Python 3.12.1's `close_clients`), so `Forwards.remove` ends them itself.
    joined: set[asyncio.Task[None]]


def _tcp_port(spec: str) -> int | None:
    kind, _, port = spec.partition(":")
    return int(port) if kind == "tcp" and port.isdigit() else None


class Forwards:
    """Forward and reverse rules of one adb server, on its event loop."""

    def __init__(self) -> None:
        self._forwards: dict[str, Forward] = {}
        self._reverses: dict[str, dict[str, str]] = {}

    async def add(self, phone: VirtualPhone, local: str, remote: str, *, rebind: bool) -> str:
        """Start forwarding; returns "" or the error adb would print."""
        port = _tcp_port(local)
        if port is None:
            return f"cannot bind listener: only tcp: local ports are supported ({local})"
        if local in self._forwards:
            if not rebind:
                return f"cannot rebind existing socket: {local}"
            await self.remove(local)

        joined: set[asyncio.Task[None]] = set()

        async def join(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            remote_port = _tcp_port(remote)
            service = phone.tcp_services.get(remote_port) if remote_port is not None else None
            task = asyncio.current_task()
            assert task is not None
            joined.add(task)
            try:
                if service is not None and phone.online:
                    await service.serve(reader, writer)
            except asyncio.CancelledError:
                pass  # the forward was removed (or its server stopped): close as adb does
            finally:
                joined.discard(task)
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

        try:
            server = await asyncio.start_server(join, "127.0.0.1", port)
        except OSError as exc:
            return f"cannot bind listener: {exc}"
        bound = server.sockets[0].getsockname()[1]
        local = f"tcp:{bound}"
        self._forwards[local] = Forward(phone.serial, local, remote, server, joined)
        return ""

    async def remove(self, local: str) -> bool:
        forward = self._forwards.pop(local, None)
        if forward is None:
            return False
        forward.server.close()
        carried = list(forward.joined)
        for task in carried:
            task.cancel()
        await asyncio.gather(*carried, return_exceptions=True)
        await forward.server.wait_closed()
        return True

    async def remove_all(self, serial: str | None = None) -> None:
        for local in [k for k, f in self._forwards.items() if serial in (None, f.serial)]:
            await self.remove(local)

    def listing(self, serial: str | None = None) -> str:
        """`list-forward`'s block: one "SERIAL LOCAL REMOTE" line per rule."""
        return "".join(
            f"{f.serial} {f.local} {f.remote}\n"
            for f in self._forwards.values()
            if serial in (None, f.serial)
        )

    def reverse(self, serial: str, request: str) -> tuple[bool, str]:
        """A `reverse:` device request: (ok, reply block or error)."""
        rules = self._reverses.setdefault(serial, {})
        if request == "list-forward":
            return True, "".join(f"UsbFfs {r} {loc}\n" for r, loc in rules.items())
        if request == "killforward-all":
            rules.clear()
            return True, ""
        if request.startswith("killforward:"):
            remote = request.removeprefix("killforward:")
            if rules.pop(remote, None) is None:
                return False, f"listener '{remote}' not found"
            return True, ""
        if request.startswith("forward:"):
            spec = request.removeprefix("forward:")
            norebind = spec.startswith("norebind:")
            remote, _, local = spec.removeprefix("norebind:").partition(";")
            if not local:
                return False, "bad reverse specification"
            if norebind and remote in rules:
                return False, f"cannot rebind existing socket: {remote}"
            rules[remote] = local
            return True, ""
        return False, f"unknown reverse request '{request}'"

    async def close(self) -> None:
        await self.remove_all()
