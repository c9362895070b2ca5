"""An adb server on a loopback port that serves virtual phones to unmodified adb clients.

It speaks the host side of the protocol (`host:version`, `host:devices[-l]`, transports,
`host-serial:…` queries, port forwarding) and the device services drivers use (`shell:`,
`shell,v2:`, `exec-out:`, `sync:`, `framebuffer:`, `reverse:`, `tcp:`); a command that keeps
running (`logcat`) streams its output. Phones can be unplugged and replugged at run time: their
open connections drop and they leave the device list, exactly what a host sees when a USB cable
is pulled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import struct
import threading
from collections.abc import Iterable

from host.devices.virtual import adb_protocol as proto
from host.devices.virtual.commands import Output
from host.devices.virtual.forwards import Forwards
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.shell import Shell

log = logging.getLogger(__name__)

_HOST_SERIAL = re.compile(
    r"^host-serial:(?P<serial>.+?):(?P<cmd>features|get-state|get-serialno|get-devpath|"
    r"list-forward|forward:.*|killforward:.*|killforward-all|wait-for-.*)$"
)
_HOST_TID = re.compile(r"^host-transport-id:(?P<tid>\d+):(?P<cmd>.+)$")


class _Closed(Exception):
    """The client went away or the phone was unplugged under us."""


class VirtualAdbServer:
    """The adb server for any number of virtual phones, on one asyncio event loop."""

    def __init__(self, phones: Iterable[VirtualPhone] = ()) -> None:
        #: Every phone, in the order added. Keyed by the phone, not its serial: cheap phones
        #: ship with one serial (`0123456789ABCDEF`), and adb lists each of them.
        self._phones: list[VirtualPhone] = []
        self._transport_ids: dict[VirtualPhone, int] = {}
        self._next_tid = 1
        self._bound: dict[VirtualPhone, set[asyncio.StreamWriter]] = {}
        #: Every open client connection (bound to a phone or not): `restart` cuts them all.
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._lock = threading.Lock()
        self._forwards = Forwards()
        self._failing_lists = 0
        self._stalling_lists = 0
        self._refusing_tracks = 0
        #: `host:devices` lists answered: a test waits on it to know a client has seen a
        #: phone missing (unplugged) in at least one list.
        self.lists_answered = 0
        for phone in phones:
            self.add_phone(phone, share_serial=True)

    # --- fleet -------------------------------------------------------------------------------

    @property
    def phones(self) -> dict[str, VirtualPhone]:
        """The phones by serial (of several with one serial, the last added)."""
        return {p.serial: p for p in self._phones}

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    def add_phone(self, phone: VirtualPhone, *, share_serial: bool = False) -> None:
        """Plug `phone` in. A phone already listed under its serial is taken out first (its
        connections cut, as a phone swapped on the cable), unless `share_serial`: then both
        are listed under the one serial, as cheap phones that ship with one are."""
        with self._lock:
            gone = [] if share_serial else [p for p in self._phones if p.serial == phone.serial]
            for old in gone:
                self._phones.remove(old)
                self._transport_ids.pop(old, None)
            self._phones.append(phone)
            self._transport_ids[phone] = self._next_tid
            self._next_tid += 1
        loop = self._loop
        for old in gone:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._drop_connections, old)
        phone.add_cable_listener(self._on_cable)
        self._notify()

    def unplug(self, serial: str) -> None:
        """Make a phone vanish: it leaves `host:devices` and its open connections are cut."""
        self.phones[serial].unplug()

    def replug(self, serial: str) -> None:
        """Bring a phone back, with a new transport id as a real reconnect gets."""
        self.phones[serial].replug()

    def cut_streams(self, serial: str) -> None:
        """Close the phone's open streams while adb keeps listing it as "device", as a USB
        hiccup does (`adb: device offline` for a moment, the phone back before anyone asks):
        the adb server closes each stream cleanly, so a command cut short reads as if it had
        finished."""
        phone = self.phones[serial]
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._drop_connections, phone)

    def fail_device_lists(self, count: int = 1) -> None:
        """Hang up on the next `count` `host:devices` requests without an answer, as an adb
        server that is restarting or wedged does (its phones are still plugged in)."""
        with self._lock:
            self._failing_lists += count

    def stall_device_lists(self, count: int = 1) -> None:
        """Never answer the next `count` `host:devices` requests (the connection stays open
        until the client hangs up), as a real adb server does while a phone on a bad cable or
        hub holds its USB thread (`adb devices` then blocks until killed)."""
        with self._lock:
            self._stalling_lists += count

    def refuse_tracking(self, count: int = 1) -> None:
        """Refuse the next `count` `host:track-devices` requests (FAIL), as a server that is
        too busy to watch, or a proxy in front of adb that serves no such request, does."""
        with self._lock:
            self._refusing_tracks += count

    def restart(self, order: Iterable[VirtualPhone] | None = None) -> None:
        """As `adb kill-server` then a new adb server on the same port: every client
        connection is cut (running commands, `host:track-devices` watchers), forwards are
        gone, and transport ids are counted from 1 again, handed out in `order` (the phones
        listed now, default in reverse: phones sharing a serial swap ids, as a new server
        that finds them in another order numbers them). Returns once the connections are
        cut."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("server not started")
        with self._lock:
            listed = [p for p in self._phones if p.online]
            ordered = list(reversed(listed) if order is None else order)
            self._transport_ids = {p: i for i, p in enumerate(ordered, 1)}
            for phone in self._phones:
                if phone not in self._transport_ids:
                    self._transport_ids[phone] = len(self._transport_ids) + 1
            self._next_tid = len(self._transport_ids) + 1
        asyncio.run_coroutine_threadsafe(self._cut_everything(), loop).result(10)

    async def _cut_everything(self) -> None:
        await self._forwards.remove_all()
        for writer in list(self._open):
            writer.transport.abort()
        self._bound.clear()
        self._changed.set()

    def open_connections(self) -> int:
        """Client connections the server holds open (bound to a phone or not)."""
        return len(self._open)

    def connections(self, serial: str) -> int:
        """Open connections bound to a phone (a command may be running on each)."""
        return sum(len(w) for p, w in self._bound.items() if p.serial == serial)

    def transport_id(self, phone: VirtualPhone) -> int:
        """The transport id adb lists `phone` under now (a new one after each replug)."""
        return self._transport_ids[phone]

    def _online(self) -> list[VirtualPhone]:
        return [p for p in self._phones if p.online]

    def _on_cable(self, phone: VirtualPhone) -> None:
        """The phone was unplugged or replugged (through us or directly on the phone)."""
        if phone.online:
            with self._lock:
                self._transport_ids[phone] = self._next_tid
                self._next_tid += 1
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if phone.online and phone.adb_state == "device":
            loop.call_soon_threadsafe(self._changed.set)
        else:
            loop.call_soon_threadsafe(self._drop_connections, phone)

    def _drop_connections(self, phone: VirtualPhone) -> None:
        for writer in list(self._bound.pop(phone, set())):
            writer.transport.abort()
        self._changed.set()

    def _notify(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._changed.set)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port (pass port=0 for a free one)."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, host, port)
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        # A connection accepted just before the close is handed to its handler a few loop
        # turns later (asyncio's accept task, the transport, then `_serve`): let those turns
        # run, or its socket is in no handler and outlives the loop (a ResourceWarning in a
        # later test; Python 3.11's Server.close() leaves accepted connections to us).
        for _ in range(5):
            await asyncio.sleep(0)
        await self._forwards.close()
        for writers in self._bound.values():
            for writer in writers:
                writer.transport.abort()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        for phone in self._phones:
            phone.remove_cable_listener(self._on_cable)
        self._server = None

    # --- connections -------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._open.add(writer)
        try:
            await self._session(reader, writer)
        except (_Closed, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here must not take the server down
            log.exception("virtual adb connection failed")
        finally:
            self._handlers.discard(task)
            self._open.discard(writer)
            for writers in self._bound.values():
                writers.discard(writer)
            await self._close(writer)

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        """Flush what was written, then close (an unplug aborts instead: see _drop_connections)."""
        if writer.transport.is_closing():
            return
        writer.close()
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await writer.wait_closed()

    async def _request(self, reader: asyncio.StreamReader) -> str:
        header = await reader.readexactly(4)
        try:
            length = int(header, 16)
        except ValueError:
            raise _Closed from None  # not the adb protocol: hang up, as adb does
        return (await reader.readexactly(length)).decode("utf-8", errors="replace")

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        if writer.transport.is_closing():
            raise _Closed
        writer.write(data)
        await writer.drain()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: a host request, and after a transport switch one device service."""
        phone = await self._host_request(await self._request(reader), reader, writer)
        if phone is not None:
            await self._device_request(phone, await self._request(reader), reader, writer)

    def _phone(self, serial: str) -> VirtualPhone | str | None:
        """The one listed phone with `serial`; when several are, adb's refusal (its
        acquire_one_transport: "more than one device"): only a transport id picks one."""
        found = [p for p in self._online() if p.serial == serial]
        if len(found) > 1:
            return "more than one device"
        return found[0] if found else None

    def _by_tid(self, tid: int) -> VirtualPhone | None:
        for phone, t in self._transport_ids.items():
            if t == tid and phone.online:
                return phone
        return None

    def _any(self) -> VirtualPhone | str:
        online = self._online()
        if not online:
            return "no devices/emulators found"
        if len(online) > 1:
            return "more than one device/emulator"
        return online[0]

    def _bind(self, phone: VirtualPhone, writer: asyncio.StreamWriter) -> None:
        self._bound.setdefault(phone, set()).add(writer)

    async def _host_request(
        self, req: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> VirtualPhone | None:
        """Answer a host request. Returns the phone a transport was switched to (the next
        request on this connection is for it), or None when the connection is finished."""
        if req == "host:version":
            await self._send(writer, proto.okay_block(f"{proto.SERVER_VERSION:04x}"))
            return None
        if req in ("host:devices", "host:devices-l"):
            with self._lock:
                failing, self._failing_lists = self._failing_lists, max(0, self._failing_lists - 1)
            if failing:
                raise _Closed
            with self._lock:
                stalling, self._stalling_lists = (
                    self._stalling_lists,
                    max(0, self._stalling_lists - 1),
                )
            if stalling:
                await reader.read()  # until the client hangs up
                raise _Closed
            await self._send(writer, proto.okay_block(self._devices(req.endswith("-l"))))
            self.lists_answered += 1
            return None
        if req == "host:track-devices":
            with self._lock:
                refusing = self._refusing_tracks
                self._refusing_tracks = max(0, refusing - 1)
            if refusing:
                await self._send(writer, proto.fail(f"unknown host service '{req}'"))
                return None
            await self._track(reader, writer)
            return None
        if req == "host:kill":
            await self._send(writer, proto.OKAY)
            return None
        if req in ("host:features", "host:host-features"):
            await self._send(writer, proto.okay_block(proto.FEATURES))
            return None
        if req == "host:list-forward":
            await self._send(writer, proto.okay_block(self._forwards.listing()))
            return None
        target: VirtualPhone | str | None = None
        tport = False
        if req.startswith("host:transport:"):
            target = self._phone(req.removeprefix("host:transport:"))
        elif req.startswith("host:tport:serial:"):
            target, tport = self._phone(req.removeprefix("host:tport:serial:")), True
        elif req.startswith("host:transport-id:"):
            tid = req.removeprefix("host:transport-id:")
            target = self._by_tid(int(tid)) if tid.isdigit() else None
        elif req.startswith("host:tport:"):
            target, tport = self._any(), True
        elif req in ("host:transport-any", "host:transport-usb", "host:transport-local"):
            target = self._any()
        elif req.startswith(
            ("host-serial:", "host-transport-id:", "host-usb:", "host-local:", "host:")
        ):
            await self._host_query(req, writer)
            return None
        else:
            await self._send(writer, proto.fail(f"unknown host service '{req}'"))
            return None
        if isinstance(target, str):
            await self._send(writer, proto.fail(target))
            return None
        if target is None:
            name = req.rsplit(":", 1)[-1]
            await self._send(writer, proto.fail(f"device '{name}' not found"))
            return None
        if target.adb_state in proto.REFUSALS:
            await self._send(writer, proto.fail(proto.REFUSALS[target.adb_state]))
            return None
        self._bind(target, writer)
        reply = proto.OKAY
        if tport:
            reply += struct.pack("<Q", self._transport_ids[target])
        await self._send(writer, reply)
        return target

    async def _host_query(self, req: str, writer: asyncio.StreamWriter) -> None:
        """`host-serial:SERIAL:cmd` and friends: one-shot questions about one phone."""
        phone: VirtualPhone | str | None
        missing = ""
        m = _HOST_SERIAL.match(req)
        if m:
            phone, cmd = self._phone(m["serial"]), m["cmd"]
            if isinstance(phone, str):
                missing, phone = phone, None
            missing = missing or f"device '{m['serial']}' not found"
        elif (t := _HOST_TID.match(req)) is not None:
            phone, cmd = self._by_tid(int(t["tid"])), t["cmd"]
            missing = f"device with transport id '{t['tid']}' not found"
        else:
            cmd = req.split(":", 1)[1]
            phone, missing = self._any(), ""
            if isinstance(phone, str):
                missing, phone = phone, None
        if cmd.startswith("wait-for-"):
            await self._wait_for(req, cmd, writer)
            return
        if not isinstance(phone, VirtualPhone):
            await self._send(writer, proto.fail(missing or f"unknown host service '{req}'"))
            return
        if phone.adb_state in proto.REFUSALS:
            await self._send(writer, proto.fail(proto.REFUSALS[phone.adb_state]))
            return
        if cmd == "features":
            await self._send(writer, proto.okay_block(proto.FEATURES))
        elif cmd == "get-state":
            await self._send(writer, proto.okay_block("device"))
        elif cmd == "get-serialno":
            await self._send(writer, proto.okay_block(phone.serial))
        elif cmd == "get-devpath":
            await self._send(writer, proto.okay_block("virtual"))
        elif cmd == "list-forward":
            await self._send(writer, proto.okay_block(self._forwards.listing(phone.serial)))
        elif cmd.startswith("forward:"):
            spec = cmd.removeprefix("forward:")
            norebind = spec.startswith("norebind:")
            local, _, remote = spec.removeprefix("norebind:").partition(";")
            error = await self._forwards.add(phone, local, remote, rebind=not norebind)
            await self._send(writer, proto.fail(error) if error else proto.OKAY + proto.OKAY)
        elif cmd.startswith("killforward:"):
            local = cmd.removeprefix("killforward:")
            if await self._forwards.remove(local):
                await self._send(writer, proto.OKAY + proto.OKAY)
            else:
                await self._send(writer, proto.fail(f"listener '{local}' not found"))
        elif cmd == "killforward-all":
            await self._forwards.remove_all(phone.serial)
            await self._send(writer, proto.OKAY + proto.OKAY)
        else:
            await self._send(
                writer, proto.fail(f"'{cmd}' is not supported by the virtual adb server")
            )

    async def _wait_for(self, req: str, cmd: str, writer: asyncio.StreamWriter) -> None:
        m = _HOST_SERIAL.match(req)
        serial = m["serial"] if m else None
        want_gone = cmd.endswith("-disconnect")
        await self._send(writer, proto.OKAY)
        while True:
            present = (
                isinstance(self._phone(serial), VirtualPhone) if serial else bool(self._online())
            )
            if present != want_gone:
                await self._send(writer, proto.OKAY)
                return
            self._changed.clear()
            await self._changed.wait()

    def _devices(self, long: bool) -> str:
        return "".join(
            proto.devices_line(
                p.serial,
                p.adb_state,
                long=long,
                model=p.model,
                transport_id=self._transport_ids[p],
                usb=p.usb_port,
            )
            for p in self._online()
        )

    async def _track(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Send the device list at once and whenever it changes, until the client hangs up
        (as a real adb server notices at once: a test counts the connections left open)."""
        await self._send(writer, proto.OKAY)
        feed = asyncio.ensure_future(self._track_feed(writer))
        hangup = asyncio.ensure_future(reader.read())  # a watcher sends nothing more
        try:
            await asyncio.wait({feed, hangup}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (feed, hangup):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await task

    async def _track_feed(self, writer: asyncio.StreamWriter) -> None:
        last = None
        while True:
            current = self._devices(False)
            if current != last:
                await self._send(writer, proto.block(current))
                last = current
            self._changed.clear()
            await self._changed.wait()

    # --- device services ---------------------------------------------------------------------

    async def _device_request(
        self,
        phone: VirtualPhone,
        req: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        if len(req.encode("utf-8")) + 1 > phone.adbd_max_payload - 1:
            log.warning(
                "virtual adb: destination oversized for %s (%d bytes)", phone.serial, len(req)
            )
            raise _Closed
        if phone.old_adbd and req.startswith(("exec:", "exec-out:", "shell,")):
            # adbd before Android 5.0 (system/core/adb/services.c) has no such service:
            # service_to_fd returns -1, create_local_service_socket none, and handle_packet
            # answers the OPEN with send_close; the adb server then fails the client's
            # request with "closed" (sockets.c, local_socket_close_notify).
            await self._send(writer, proto.fail("closed"))
            return
        if phone.take_service_close(req):
            await self._send(writer, proto.fail("closed"))
            return
        stall = phone.take_service_stall(req)
        if stall is not None:
            with contextlib.suppress(TimeoutError):
                # The client sends nothing before the OKAY: a read ends only by its hangup.
                if await asyncio.wait_for(reader.read(1), stall) == b"":
                    raise _Closed
        if req.startswith("shell") and ":" in req:
            opts, _, cmd = req.partition(":")
            v2 = "v2" in opts.split(",")
            if not cmd:
                await self._send(
                    writer, proto.fail("interactive shells are not supported by the virtual phone")
                )
                return
            await self._send(writer, proto.OKAY)
            await self._shell(phone, cmd, reader, writer, v2=v2)
        elif req.startswith(("exec:", "exec-out:")):
            await self._send(writer, proto.OKAY)
            await self._shell(phone, req.split(":", 1)[1], reader, writer, v2=False)
        elif req == "sync:":
            await self._send(writer, proto.OKAY)
            await self._sync(phone, reader, writer)
        elif req == "root:":
            await self._send(writer, proto.OKAY + b"adbd cannot run as root in production builds\n")
        elif req == "framebuffer:":
            img = await asyncio.to_thread(lambda: phone.screenshot().convert("RGBA"))
            await self._send(
                writer, proto.OKAY + proto.framebuffer(img.width, img.height, img.tobytes())
            )
        elif req.startswith("reverse:"):
            ok, reply = self._forwards.reverse(phone.serial, req.removeprefix("reverse:"))
            if not ok:
                await self._send(writer, proto.OKAY + proto.fail(reply))
            elif req == "reverse:list-forward":
                await self._send(writer, proto.okay_block(reply))
            else:
                await self._send(writer, proto.OKAY + proto.OKAY)
        elif req.startswith("tcp:"):
            port = req.removeprefix("tcp:")
            service = phone.tcp_services.get(int(port)) if port.isdigit() else None
            if service is None:
                await self._send(writer, proto.fail(f"connect failed: connection refused ({req})"))
                return
            await self._send(writer, proto.OKAY)
            await service.serve(reader, writer)
        else:
            await self._send(writer, proto.fail(f"unknown service '{req}'"))

    async def _shell(
        self,
        phone: VirtualPhone,
        cmd: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        v2: bool,
    ) -> None:
        loop = asyncio.get_running_loop()

        def live(fd: int, data: bytes) -> None:
            """Output of a command that keeps running (`logcat`), sent as it comes."""
            if not data:
                return
            framed = proto.shell_v2_packet(fd, data) if v2 else data
            loop.call_soon_threadsafe(self._write_live, writer, framed)

        shell = Shell(phone, threading.Event(), live=live)
        result = await self._run_until_hangup(shell, cmd, reader)
        if not phone.online:
            raise _Closed  # the cable was pulled while the command ran: the output is lost
        if v2:
            packets = b"".join(proto.shell_v2_packet(fd, data) for fd, data in result.chunks)
            await self._send(
                writer, packets + proto.shell_v2_packet(proto.EXIT, bytes([result.code & 0xFF]))
            )
        elif phone.old_adbd:
            # On a pty (adbd before Android 7 ran every `shell:` command on one): the line
            # discipline's ONLCR writes each "\n" as "\r\n", in binary output too.
            await self._send(writer, result.combined.replace(b"\n", b"\r\n"))
        else:
            await self._send(writer, result.combined)

    @staticmethod
    def _write_live(writer: asyncio.StreamWriter, data: bytes) -> None:
        if not writer.transport.is_closing():
            writer.write(data)

    async def _run_until_hangup(
        self, shell: Shell, cmd: str, reader: asyncio.StreamReader
    ) -> Output:
        """Run a command in a worker thread; if the client hangs up first, tell the command
        (long-running ones such as `sleep` or a started agent then stop, as on a phone)."""
        work = asyncio.ensure_future(asyncio.to_thread(shell.run, cmd))
        hangup = asyncio.ensure_future(reader.read(4096))
        try:
            while not work.done():
                await asyncio.wait({work, hangup}, return_when=asyncio.FIRST_COMPLETED)
                if hangup.done() and not work.done():
                    if hangup.result() == b"":
                        shell.cancel.set()
                        break
                    hangup = asyncio.ensure_future(reader.read(4096))  # stdin: ignored
            return await work
        finally:
            if not work.done():  # the server is stopping: end the command like a hangup would
                shell.cancel.set()
            hangup.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await hangup
            # ...and wait for it: left pending on a loop that then closes, it was destroyed
            # later by the collector, in whatever code ran then ("Task was destroyed but it
            # is pending"). A cancelled command returns within the shell's poll (`Shell.wait`).
            await asyncio.wait({work})
            if not work.cancelled():
                work.exception()  # retrieved: the connection that wanted it is gone

    async def _sync(
        self, phone: VirtualPhone, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        fs = phone.files
        while True:
            header = await reader.readexactly(8)
            ident, length = header[:4], struct.unpack("<I", header[4:])[0]
            if ident == b"QUIT":
                return
            if length > 4096 and ident != b"SEND":
                await self._send(writer, proto.sync_fail("path too long"))
                return
            path = (await reader.readexactly(length)).decode("utf-8", errors="replace")
            if not phone.online:
                raise _Closed
            if ident == b"STAT":
                st = fs.stat(path)
                await self._send(
                    writer,
                    proto.sync_packet(
                        b"STAT", *((st.mode, st.size, st.mtime) if st else (0, 0, 0))
                    ),
                )
            elif ident == b"LIST":
                entries = fs.listdir(path) or []
                out = b"".join(
                    proto.sync_dent(name, st.mode, st.size, st.mtime) for name, st in entries
                )
                await self._send(writer, out + proto.sync_packet(b"DONE", 0, 0, 0, 0))
            elif ident == b"RECV":
                data = fs.read(path)
                if data is None:
                    st = fs.stat(path)
                    why = "Is a directory" if st and st.is_dir else "No such file or directory"
                    # adbd's do_recv: SendSyncFailErrno(s, "open failed").
                    await self._send(writer, proto.sync_fail(f"open failed: {why}"))
                    continue
                await self._send(
                    writer, b"".join(proto.sync_data_chunks(data)) + proto.sync_packet(b"DONE", 0)
                )
            elif ident == b"SEND":
                await self._receive_file(phone, path, reader, writer)
            else:
                await self._send(writer, proto.sync_fail(f"unknown sync request {ident!r}"))
                return

    async def _receive_file(
        self,
        phone: VirtualPhone,
        spec: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        path, _, mode_text = spec.rpartition(",")
        if not path:
            path, mode_text = spec, "33188"
        parts: list[bytes] = []
        while True:
            header = await reader.readexactly(8)
            ident, value = header[:4], struct.unpack("<I", header[4:])[0]
            if ident == b"DATA":
                parts.append(await reader.readexactly(value))
            elif ident == b"DONE":
                break
            else:
                await self._send(writer, proto.sync_fail(f"bad sync packet {ident!r} during SEND"))
                raise _Closed
        mode = int(mode_text) if mode_text.isdigit() else 0o100644
        data = b"".join(parts)
        if phone.storage_left is not None and len(data) > phone.storage_left:
            # adbd drains the transfer to its DONE, removes what it wrote, and answers
            # SendSyncFailErrno(s, "write failed").
            await self._send(writer, proto.sync_fail("write failed: No space left on device"))
        elif phone.files.write(path, data, mode=mode, mtime=value):
            await self._send(writer, proto.sync_packet(b"OKAY", 0))
        else:
            await self._send(
                writer, proto.sync_fail(f"couldn't create file: {path}: Is a directory")
            )


class ThreadedAdbServer:
    """A `VirtualAdbServer` on its own event loop thread, for synchronous callers and tests."""

    def __init__(self, phones: Iterable[VirtualPhone] = ()) -> None:
        self.server = VirtualAdbServer(phones)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    @property
    def port(self) -> int:
        return self._port

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="virtual-adb", daemon=True)
        self._thread.start()
        self._port = asyncio.run_coroutine_threadsafe(self.server.start(host, port), loop).result(
            10
        )
        return self._port

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), loop).result(10)
        except Exception:  # still stop the loop and thread below
            log.exception("virtual adb server did not stop cleanly")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = None

    def unplug(self, serial: str) -> None:
        self.server.unplug(serial)

    def fail_device_lists(self, count: int = 1) -> None:
        self.server.fail_device_lists(count)

    def stall_device_lists(self, count: int = 1) -> None:
        self.server.stall_device_lists(count)

    def replug(self, serial: str) -> None:
        self.server.replug(serial)

    def refuse_tracking(self, count: int = 1) -> None:
        self.server.refuse_tracking(count)

    def restart(self, order: Iterable[VirtualPhone] | None = None) -> None:
        self.server.restart(order)

    def __enter__(self) -> ThreadedAdbServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
