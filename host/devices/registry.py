"""Which phones a host has: polls an adb server and notices phones that vanish or come back."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import Literal

import adbutils

from amc.v1 import types_pb2
from host.devices import adb_restarts, adb_transport
from host.devices.adb_errors import (
    NO_ADB_SERVER,
    server_reachable,
    start_server_hint,
    state_fix,
)
from host.devices.adb_errors import (
    no_adb_server_reason as no_adb_server_reason,  # said by the registry too
)

log = logging.getLogger(__name__)

AdbState = str
#: How long one device list may wait for the adb server's answer (a healthy one answers at
#: once; a wedged one never does, and the poll must not wait on it for good).
LIST_TIMEOUT_S = 10.0
#: How long a phone adb no longer lists stays known (as OFFLINE) by default: a day.
FORGET_AFTER_S = 24 * 3600.0
#: At most this many phones in a hello or device update (`HostHello.devices`,
#: `DeviceUpdate.devices` in proto/amc/v1/lease_service.proto; the cloud refuses more).
MAX_REPORTED = 256
#: The longest phone id the cloud takes (`Device.serial` in proto/amc/v1/types.proto): it
#: refuses a hello or device update naming a longer one whole, and every phone of the host
#: then sat idle. Such a phone is left out of what the host reports (`reported`).
MAX_SERIAL = 128
_STATE_MAP: dict[str, types_pb2.DeviceState.ValueType] = {
    "device": types_pb2.DEVICE_STATE_ONLINE,
    "offline": types_pb2.DEVICE_STATE_OFFLINE,
    "unauthorized": types_pb2.DEVICE_STATE_UNAUTHORIZED,
    # No DeviceState of its own: OFFLINE, with what to do as its reason (`DeviceInfo.adb_reason`).
    "no permissions": types_pb2.DEVICE_STATE_OFFLINE,
}
#: adb states a phone takes no work in whose reason tells the operator what to do
#: (`state_fix`): reported OFFLINE, the phone's listing said nothing of why.
_REASONED = frozenset({"no permissions"})
#: adb states a phone passes through as it is plugged in, reported OFFLINE: a short word of
#: what adb waits for, so a phone stuck in one is not just "offline" (the fix, should it
#: stay so, is in the failed task's error: `adb_errors.gone`).
_PASSING = {
    # adb is trying its keys with the phone (AOSP adb's kCsAuthorizing); a phone showing its
    # "Allow USB debugging?" prompt is listed "unauthorized" (UNAUTHORIZED), not this.
    "authorizing": "adb is checking its key with the phone",
    "connecting": "adb is connecting to the phone",
}
#: Why a phone addressed by transport id is OFFLINE after the adb server restarted
#: (`adb_restarts`): the new server's ids may name its twin, so the host sends it nothing.
RENUMBERED_REASON = (
    "the adb server restarted and numbered its phones afresh: this phone shares its serial "
    "with another, and adb named no USB port to tell them apart (it names none on Windows or "
    "over Wi-Fi), so the host cannot say which transport is this phone; it is listed again "
    "under a new id (give the phones their own serials to keep their ids across adb restarts)"
)

#: Why a phone on a named USB port (`serial@usb:<port>`) a driver found renumbered is OFFLINE
#: for now: its port tells it from its twin, so the next poll finds it under its id again.
RENUMBERED_USB_REASON = (
    "the adb server restarted: the phone is found again on its USB port at the next device poll"
)


def _listed_state(adb_state: str) -> str:
    """adb's state for a listed phone: adb lists a phone its server's user may not open as
    `no permissions (…); see […]`, which adbutils splits at the first space into "no"."""
    return "no permissions" if adb_state == "no" else adb_state


def _adb_reason(adb_state: str, on_usb_port: bool = False) -> str:
    """Why a phone adb lists in `adb_state` takes no work and what fixes it, or what adb
    waits for in a moment's state (`_PASSING`); "" when its state says enough (ONLINE,
    UNAUTHORIZED, OFFLINE). `on_usb_port`: the host's id for the phone names its USB port
    (it keeps that id across adb restarts)."""
    if adb_state == adb_restarts.RENUMBERED:
        return RENUMBERED_USB_REASON if on_usb_port else RENUMBERED_REASON
    if adb_state in _PASSING:
        return _PASSING[adb_state]
    return state_fix(adb_state) if adb_state in _REASONED else ""


#: Between a shared serial and what tells its phones apart in the host's ids for them.
SHARED_MARK = "@"
_USB_MARK = SHARED_MARK + "usb:"


def _on_usb_port(serial: str) -> bool:
    """The host's id names the phone's USB port: adb's next server finds it there again."""
    return _USB_MARK in serial


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One phone as the host reports it (the lease hello's `Device`).

    `serial` is the host's id for the phone: adb's serial, unless another phone adb listed
    had the same one when this one appeared (cheap phones ship with `0123456789ABCDEF`);
    then `serial@t<transport id>` (`serial@usb:<port>` where adb names the USB port), and
    `adb_serial` holds adb's."""

    serial: str
    model: str
    state: types_pb2.DeviceState.ValueType
    #: adb's transport id for the phone as last listed (None when adb gives none).
    transport_id: int | None = None
    #: adb's serial when it is not `serial` (see above); "" otherwise.
    adb_serial: str = ""
    #: Another phone adb lists has the same serial now: adb refuses that serial ("more than
    #: one device"), so the phone is addressed by `transport_id`.
    shared: bool = False
    #: Why the host keeps the phone out of work though adb lists it (its screen could not be
    #: read: `host.devices.health`); "" for a healthy phone.
    unhealthy: str = ""
    #: Why adb's state for the phone lets no command through and what fixes it (a phone
    #: adb has no permission to open: `_REASONED`); "" otherwise.
    adb_reason: str = ""
    #: The adb server run `transport_id` was read in (`adb_restarts.ServerWatch.run`): a
    #: driver sends nothing through it once that run ended.
    adb_run: int = 0
    #: OFFLINE because the adb server did not answer (`no_adb_server_reason`), not because
    #: adb said the phone left: it may well be plugged in still.
    adb_down: bool = False

    @property
    def online(self) -> bool:
        return self.state == types_pb2.DEVICE_STATE_ONLINE

    @property
    def usable(self) -> bool:
        """Online as the cloud hears it (`to_proto`): adb lists it online and the host has not
        kept it out of work."""
        return self.online and not self.unhealthy

    @property
    def address(self) -> int | None:
        """The transport id a driver must select the phone by; None: by its serial."""
        return self.transport_id if self.shared or self.adb_serial else None

    def to_proto(self) -> types_pb2.Device:
        """As the cloud hears it: an unhealthy phone is OFFLINE (not usable), so it is offered
        no task until the host clears the mark, and `reason` says why (a cloud's operators
        saw it "offline" with no word of what ails it). A phone adb may not open is OFFLINE
        too, its `adb_reason` the reason."""
        state = types_pb2.DEVICE_STATE_OFFLINE if self.unhealthy else self.state
        return types_pb2.Device(
            serial=self.serial,
            model=self.model,
            state=state,
            reason=self.unhealthy or self.adb_reason,
        )


ChangeKind = Literal["online", "offline", "changed", "forgotten"]
Listener = Callable[[DeviceInfo, ChangeKind], None]


class DeviceRegistry:
    """The host's phones. `refresh()` re-reads the adb server and reports what changed.

    A phone that was seen once stays known (as OFFLINE) after it vanishes, so the cloud learns
    it went away rather than silently losing it, until it has been gone `forget_after_s`: on a
    host where emulators or phones come and go under new serials (adb over Wi-Fi, rebooted
    emulators) the list grew for good, and every report was cut at `MAX_REPORTED`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5037,
        only_serials: list[str] | None = None,
        offline_after_failed_polls: int = 3,
        timeout_s: float = LIST_TIMEOUT_S,
        forget_after_s: float = FORGET_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = adb_transport.Client(host=host, port=port, timeout_s=timeout_s)
        self._addr = (host, port)
        self._only = set(only_serials or [])
        self._devices: dict[str, DeviceInfo] = {}
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        #: Polls in a row whose device list failed on a reachable server (an adb server
        #: restarting, a timeout): the last states stand until this many have failed.
        self._failed_polls = 0
        self._offline_after = max(1, offline_after_failed_polls)
        self._forget_after = forget_after_s
        self._clock = clock
        #: How long each known phone has been missing from lists adb answered (seconds):
        #: the time from one answered list to the next, summed while it is missing.
        self._absent_for: dict[str, float] = {}
        #: When adb last answered a list (`clock` time); None after a poll it did not answer:
        #: the time until its next answer is not counted as absence.
        self._listed_at: float | None = None
        #: Phones kept out of work, and why (`mark_unhealthy`): kept across polls.
        self._unhealthy: dict[str, str] = {}
        self._watch = adb_restarts.watch(host, port)
        #: The adb server run of the last answered list (None before the first).
        self._run: int | None = None
        #: The last poll found no adb server: said once as it goes, once as it comes back.
        self._down = False
        #: Whether the server ever answered this process: one not there from the start has no
        #: phones to lose; the start-up banner says it (`server_answers`), not a warning.
        self._answered_once = False

    @property
    def server_answers(self) -> bool:
        """Whether the adb server answered the last poll."""
        return not self._down

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def close(self) -> None:
        """Tell no one of changes any more (the host stopped). A listener's owner (the lease
        client) holds this registry: a kept listener made a cycle, and a stopped host waited
        for the cycle collector to be freed. The adb server's watch connection is closed
        too (it stayed open until the watch was collected); a driver still holding a
        transport id then finds it of a run that ended (`adb_restarts.check`)."""
        self._listeners.clear()
        self._watch.close()

    def devices(self) -> list[DeviceInfo]:
        with self._lock:
            return sorted(self._devices.values(), key=lambda d: d.serial)

    def get(self, serial: str) -> DeviceInfo | None:
        with self._lock:
            return self._devices.get(serial)

    def listed(self, serial: str) -> bool:
        """adb's last answered list had the phone (in any state): it is not counted absent."""
        with self._lock:
            return serial in self._devices and serial not in self._absent_for

    def _model(self, serial: str, transport_id: int | None) -> str:
        try:
            out = adb_transport.run(
                self._client, serial, "shell:getprop ro.product.model", 5.0, transport_id
            )
            return out.decode("utf-8", "replace").strip() or serial
        except (adbutils.AdbError, OSError):
            return serial

    def _booted(self, serial: str, transport_id: int | None) -> bool:
        """Whether the phone has finished booting (`sys.boot_completed` is 1); True when it
        cannot be asked, so a failed question never keeps a phone out."""
        try:
            out = adb_transport.run(
                self._client, serial, "shell:getprop sys.boot_completed", 5.0, transport_id
            )
        except (adbutils.AdbError, OSError):
            return True
        return out.decode("utf-8", "replace").strip() not in ("", "0")

    def _ids(
        self, listing: list[adbutils.AdbDeviceInfo], known: dict[str, DeviceInfo], run: int
    ) -> dict[str, tuple[str, str, int | None, bool]]:
        """Each listed phone under the host's id for it: (adb serial, adb state, transport
        id, serial shared). A phone keeps the id it has while its transport lives; a new one
        is known by its serial unless another listed phone has the same serial.

        A transport lives only as long as the adb server run (`run`) that numbered it: after
        a restart the same ids name whichever phone the new server found first, so phones
        sharing a serial are told apart by their USB port alone (the same id as before:
        found again), and without one get new ids, `@r<run>` marking the run, which never
        match an id of the run before."""
        counts = Counter(i.serial for i in listing)
        by_transport = {
            (d.adb_serial or d.serial, d.transport_id): d.serial
            for d in known.values()
            if d.transport_id is not None and d.adb_run == run
        }
        out: dict[str, tuple[str, str, int | None, bool]] = {}
        for item in listing:
            tid = item.transport_id
            shared = counts[item.serial] > 1 and tid is not None
            key = by_transport.get((item.serial, tid))
            if key is None:
                key = item.serial
                if shared:
                    usb = item.tags.get("usb")
                    run_mark = f"r{run}" if run else ""
                    key += f"{_USB_MARK}{usb}" if usb else f"{SHARED_MARK}{run_mark}t{tid}"
            out[key] = (item.serial, _listed_state(item.state), tid, shared)
        return out

    def refresh(self, held: Collection[str] = ()) -> list[tuple[DeviceInfo, ChangeKind]]:
        """Poll the adb server once; an unreachable server makes every phone OFFLINE. A device
        list that fails on a reachable server keeps the last states (no change reported) until
        `offline_after_failed_polls` polls in a row have failed, so one glitch does not flap
        the whole fleet offline and back. A phone missing from the list for `forget_after_s`
        is forgotten ("forgotten"), unless it is among `held` (an attempt still holds it);
        only lists adb answered count, so an adb server down for longer forgets no phone."""
        listing: list[adbutils.AdbDeviceInfo] = []
        answered = False  # adb gave its list: only then is a phone missing from it gone
        run = self._run or 0
        reachable = server_reachable(*self._addr)
        if reachable:
            try:
                before = self._watch.watched_run()
                listing = self._client.list(extended=True)  # with each transport id
                after = self._watch.watched_run()
                if before is None or after != before:
                    # Which server's ids these are is not known (it restarted, or it was
                    # not watched, so a restart would go unseen): the next poll lists again.
                    self._listed_at = None
                    return []
                run = before
                answered = True
                self._failed_polls = 0
            except (adbutils.AdbError, OSError) as exc:
                self._failed_polls += 1
                log.warning("adb device list failed (%d in a row): %s", self._failed_polls, exc)
                if self._failed_polls < self._offline_after:
                    self._listed_at = None
                    return []
        # No list: no server listens, or one that accepts connections gave none for
        # `offline_after_failed_polls` polls (hung, or the near end of a tunnel whose far
        # server is down): either way the server does not answer.
        down = not answered
        self._said_down(down)
        if self._only:
            listing = [i for i in listing if i.serial in self._only]
        changes: list[tuple[DeviceInfo, ChangeKind]] = []
        quiet: list[DeviceInfo] = []  # a new transport id, nothing the cloud needs to hear
        with self._lock:
            known = dict(self._devices)
            missing = set(self._absent_for)  # from the last answered list
        listed = self._ids(listing, known, run)
        restarted = answered and self._run is not None and run != self._run
        if answered:
            self._run = run
        for serial, (adb_serial, adb_state, tid, shared) in listed.items():
            state = _STATE_MAP.get(adb_state, types_pb2.DEVICE_STATE_OFFLINE)
            reason = _adb_reason(adb_state)
            old = known.get(serial)
            own = "" if adb_serial == serial else adb_serial
            if old is not None and (old.state, old.adb_reason) == (state, reason):
                if (old.transport_id, old.shared, old.adb_run) != (tid, shared, run):
                    quiet.append(
                        DeviceInfo(
                            serial, old.model, state, tid, own, shared, "", reason, adb_run=run
                        )
                    )
                continue
            addressed = tid if shared or own else None
            if state == types_pb2.DEVICE_STATE_ONLINE and not self._booted(adb_serial, addressed):
                # adb lists a phone as "device" as soon as its adbd runs, well before a
                # booting phone's system services are up: every attempt on it would end at
                # once. OFFLINE (the contract's "rebooting") until it has booted; asked again
                # at each poll.
                state = types_pb2.DEVICE_STATE_OFFLINE
                if old is not None and (old.state, old.adb_reason) == (state, reason):
                    continue
            model = old.model if old and old.model != adb_serial else adb_serial
            if state == types_pb2.DEVICE_STATE_ONLINE and (old is None or old.model == adb_serial):
                model = self._model(adb_serial, addressed)
            info = DeviceInfo(serial, model, state, tid, own, shared, "", reason, adb_run=run)
            if old is None and (refused := refused_serial(serial)):
                log.warning("phone %s left out: %s", serial, refused)
            if shared and old is None:
                log.warning(
                    "adb lists several phones with the serial %s: this one (transport id %s) "
                    "is %s on this host; give the phones their own serials (or, on a "
                    "Linux or macOS host, keep them on fixed USB ports) so each keeps its "
                    "id across reconnects",
                    adb_serial,
                    tid,
                    serial,
                )
            kind: ChangeKind = (
                "online" if info.online else ("offline" if old is None or old.online else "changed")
            )
            changes.append((info, kind))
        for serial, old in known.items():
            # Addressed by a transport id of the server run before, and listed by it: gone
            # for that reason. Not a phone on a named USB port (the port keeps its id: were
            # it plugged in, it would be listed under it), nor one already missing then.
            renumbered = (
                restarted
                and old.address is not None
                and not _on_usb_port(serial)
                and serial not in missing
            )
            # Out of sight while no adb server answers, OFFLINE already or not (a driver
            # that met no server marked its phone OFFLINE before this poll: it named no
            # server to the cloud); said gone once one answers without it.
            if serial not in listed and (
                old.state != types_pb2.DEVICE_STATE_OFFLINE
                or (renumbered and old.adb_reason != RENUMBERED_REASON)
                or old.adb_down != down
            ):
                # The rest as it was (the run its id was read in, whether its serial is
                # shared): the same server listing the phone again gives it the same id.
                reason = no_adb_server_reason(*self._addr) if down else ""
                left = replace(
                    old,
                    state=types_pb2.DEVICE_STATE_OFFLINE,
                    adb_reason=RENUMBERED_REASON if renumbered else reason,
                    adb_down=down,
                )
                was_offline = old.state == types_pb2.DEVICE_STATE_OFFLINE
                changes.append((left, "changed" if was_offline else "offline"))
        now = self._clock()
        with self._lock:
            for info in [*quiet, *(info for info, _ in changes)]:
                why = self._unhealthy.get(info.serial, "")
                self._devices[info.serial] = replace(info, unhealthy=why)
            # Without a list (no server, or its lists failing) the phones are out of sight,
            # not gone: counting that as absence forgot every phone after an adb outage
            # longer than `forget_after_s`, all of them still plugged in, and a phone missing
            # before the outage as soon as lists came back.
            step = now - self._listed_at if answered and self._listed_at is not None else 0.0
            self._listed_at = now if answered else None
            # A phone marked unhealthy that adb never listed to this process (a mark the last
            # run kept: `host.runner._restore_marks`) is missing as a listed phone is, and
            # forgotten after as long: else its mark stayed in memory for the whole run.
            unlisted = [s for s in self._unhealthy if s not in self._devices]
            for serial in [*self._devices, *unlisted] if answered else ():
                if serial in listed:
                    self._absent_for.pop(serial, None)
                elif serial in self._absent_for:
                    self._absent_for[serial] += step
                else:
                    self._absent_for[serial] = 0.0  # missing from this list on
            for serial, absent in list(self._absent_for.items()) if answered else ():
                if absent >= self._forget_after and serial not in held:
                    del self._absent_for[serial]
                    why = self._unhealthy.pop(serial, "")  # back after this, it starts afresh
                    gone = self._devices.pop(serial, None) or DeviceInfo(
                        serial, serial, types_pb2.DEVICE_STATE_OFFLINE, unhealthy=why
                    )
                    changes.append((gone, "forgotten"))
                    log.info("forgot phone %s: adb has not listed it for %.0f s", serial, absent)
        for info, kind in changes:
            for listener in self._listeners:
                listener(info, kind)
        return changes

    def _said_down(self, down: bool) -> None:
        """Tell the operator once that the adb server stopped answering (every phone goes
        OFFLINE with it: the fault is the server's, not N phones'), and once that it is back."""
        if not down:
            self._answered_once = True
        if down == self._down:
            return
        self._down = down
        if down and not self._answered_once:  # the banner says it (`host/startup.py`)
            log.debug(
                "the adb server at %s:%d does not answer (yet): no phone is listed until it "
                "does; start it with %s",
                *self._addr,
                start_server_hint(*self._addr),
            )
        elif down:
            with self._lock:
                online = sum(d.online for d in self._devices.values())
            log.warning(
                "the adb server at %s:%d does not answer: its %d online phone(s) are reported "
                "OFFLINE, and attempts on them end (retryable, for another host) unless it "
                "answers within the phone-lost grace; start it with %s, or mend the link to it",
                *self._addr,
                online,
                start_server_hint(*self._addr),
            )
        else:
            log.info("the adb server at %s:%d answers again", *self._addr)

    def mark_offline(self, serial: str, adb_state: AdbState = "") -> bool:
        """A driver saw the phone vanish; report it now rather than at the next poll, as adb
        lists it when the driver learnt that ("unauthorized" is not OFFLINE: it needs the
        operator at the phone's prompt, not at its cable)."""
        adb_state = _listed_state(adb_state)
        state = _STATE_MAP.get(adb_state, types_pb2.DEVICE_STATE_OFFLINE)
        if state == types_pb2.DEVICE_STATE_ONLINE:
            state = types_pb2.DEVICE_STATE_OFFLINE
        down = adb_state == NO_ADB_SERVER
        reason = (
            no_adb_server_reason(*self._addr)
            if down
            else _adb_reason(adb_state, _on_usb_port(serial))
        )
        with self._lock:
            old = self._devices.get(serial)
            if old is None or (old.state, old.adb_reason) == (state, reason):
                return False
            info = DeviceInfo(
                serial,
                old.model,
                state,
                old.transport_id,
                old.adb_serial,
                unhealthy=old.unhealthy,
                adb_reason=reason,
                adb_run=old.adb_run,
                adb_down=down,
            )
            self._devices[serial] = info
        kind: ChangeKind = "offline" if old.online else "changed"
        for listener in self._listeners:
            listener(info, kind)
        return True

    def mark_unhealthy(self, serial: str, why: str) -> bool:
        """Keep a phone adb lists out of work, saying `why` (`host.devices.health`), until
        `mark_healthy`; the cloud hears it as OFFLINE. Whether that changed anything."""
        return self._set_unhealthy(serial, why)

    def mark_healthy(self, serial: str) -> bool:
        """A look at the phone worked again: it takes work (if adb lists it online)."""
        return self._set_unhealthy(serial, "")

    def _set_unhealthy(self, serial: str, why: str) -> bool:
        with self._lock:
            if why:
                self._unhealthy[serial] = why
            else:
                self._unhealthy.pop(serial, None)
            old = self._devices.get(serial)
            if old is None or old.unhealthy == why:
                return False
            info = self._devices[serial] = replace(old, unhealthy=why)
        for listener in self._listeners:
            listener(info, "changed")
        return True


def refused_serial(serial: str) -> str:
    """Why the cloud would refuse this phone id ("" when it takes it): the host leaves such a
    phone out of what it reports (`reported`), so the start banner and the local console say
    this too rather than list it as a phone that can get work."""
    if len(serial) > MAX_SERIAL:
        return (
            f"the cloud takes phone ids of at most {MAX_SERIAL} characters, "
            f"this one has {len(serial)}"
        )
    return ""


def reported(devices: Iterable[DeviceInfo]) -> list[DeviceInfo]:
    """The phones a hello or device update carries: those that can take work first, then
    those adb lists that cannot (kept out as unhealthy, or in another state), then the gone
    ones, each by serial, cut at `MAX_REPORTED`, so a list over the limit loses gone phones,
    never one a task could run on. An unhealthy phone is reported OFFLINE: ranked with the
    online ones, a fleet of sick phones with serials early in the alphabet cut healthy ones
    out of the report, and the cloud never offered them work. A phone whose id is longer than
    `MAX_SERIAL` is left out (said once, when it appears: `DeviceRegistry.refresh`): named,
    it cost the host its whole hello."""

    def rank(d: DeviceInfo) -> tuple[int, str]:
        if d.usable:
            return 0, d.serial
        return (2 if d.state == types_pb2.DEVICE_STATE_OFFLINE else 1), d.serial

    fits = (d for d in devices if not refused_serial(d.serial))
    return sorted(fits, key=rank)[:MAX_REPORTED]
