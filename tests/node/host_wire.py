"""Drives tests/node/host_wire.js: a Node.js host's side of the Lease stream and of Decide,
message by message, so a test sees exactly what a host written from proto/ alone sends (its
proto3 defaults included) and what the cloud answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("host_wire.js")

Event = dict[str, Any]


class NodeHost:
    """One Node process holding one host certificate."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.events: list[Event] = []

    @classmethod
    async def start(cls, node: str, address: str, pki_dir: Path, host_id: str) -> NodeHost:
        proc = await asyncio.create_subprocess_exec(
            node,
            str(SCRIPT),
            address,
            str(pki_dir),
            host_id,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def command(self, **command: Any) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self._proc.stdin.drain()

    async def open(self, hello: dict[str, Any]) -> Event:
        """Open the stream with `hello`; returns the cloud's first answer ({"welcome": …} when
        the hello was taken, {"rejected": …} when not)."""
        await self.command(op="open")
        await self.command(op="send", msg={"hello": hello})
        first: Event = (await self.next(lambda e: "lease" in e or "status" in e)).get("lease", {})
        return first

    async def send(self, **msg: Any) -> None:
        await self.command(op="send", msg=msg)

    async def next(self, wanted: Callable[[Event], bool], within: float = 20.0) -> Event:
        """The next event `wanted` accepts (earlier ones are kept in `events`)."""
        assert self._proc.stdout is not None
        async with asyncio.timeout(within):
            while True:
                line = await self._proc.stdout.readline()
                if not line:
                    raise AssertionError(f"the Node host ended; it heard {self.events}")
                event: Event = json.loads(line)
                self.events.append(event)
                if wanted(event):
                    return event

    async def lease(self, kind: str, within: float = 20.0) -> Event:
        """The next LeaseResponse of `kind` ("welcome", "assignment", "rejected", …)."""
        found = await self.next(lambda e: "lease" in e and e["lease"]["kind"] == kind, within)
        message: Event = found["lease"][kind]
        return message

    async def decide(self, request: dict[str, Any]) -> Event:
        """Call Decide; returns {"decided": …} or {"error": …}."""
        await self.command(op="decide", req=request)
        return await self.next(lambda e: "decided" in e or "error" in e)

    async def __aenter__(self) -> NodeHost:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            async with asyncio.timeout(10):
                await self._proc.wait()
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
