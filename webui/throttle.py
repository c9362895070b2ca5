"""Failed logins slow the next try down: per user and per client address, doubling delays.

Each failed attempt counts against the user it named (when the console has user names) and
against the client's address. After `free` failures in a row on a key, the next attempt on it
must wait `base` seconds, doubling with each further failure up to `cap`; an attempt made
sooner is refused without checking the secret (so it also costs the console no password
hash), and the client is told how long to wait: HTTP 429 with `Retry-After`. A successful login
clears the user's and the address's counts. Per address stops one client trying many
passwords; per user stops many clients sharing one guess list against one account — at the
price that they can also slow that account's real owner down (for at most `cap` per attempt).

The operators' console counts wrong API bearer tokens against the address too
(`console.gateway.auth.require_api_user`), answered 429 the same way, under keys of their own
(`attempt_keys`): wrong tokens never slow a login down, nor wrong passwords a token.

State is in memory and forgotten `cap` after a key's last failure. It is bounded in two tables
of `max_keys` each, one of addresses and one of accounts (keys naming a user), each forgetting
one of its least recently failed keys that delays no one first, never the key just counted
(`_bound`): in one table, a script trying from many addresses pushed out an account's delay,
and the guessing at that account went on at full speed.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from fastapi import FastAPI, Request

#: How many of a full table's least recently failed keys are looked at for one to forget.
_LOOK = 64


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    allowed_at: float


class LoginThrottle:
    """Failures per key ("login:user:…", "token:addr:…") and when each key may try again."""

    def __init__(
        self,
        free: int = 5,
        base_s: float = 1.0,
        cap_s: float = 300.0,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free, self.base_s, self.cap_s = free, base_s, cap_s
        self._max_keys = max_keys
        self._clock = clock
        #: Address keys ("login:addr:…", "token:addr:…"), and account keys ("…:user:…").
        self._keys: OrderedDict[str, _Failures] = OrderedDict()
        self._accounts: OrderedDict[str, _Failures] = OrderedDict()

    def _table(self, key: str) -> OrderedDict[str, _Failures]:
        return self._accounts if ":user:" in key else self._keys

    def retry_after(self, keys: Iterable[str]) -> float:
        """Seconds until an attempt on all of `keys` is allowed (0: now)."""
        now = self._clock()
        wait = 0.0
        for key in keys:
            found = self._table(key).get(key)
            if found is not None:
                wait = max(wait, found.allowed_at - now)
        return wait

    def failed(self, keys: Iterable[str]) -> None:
        """A failed attempt on each of `keys`."""
        now = self._clock()
        for table in (self._keys, self._accounts):
            self._forget_old(table, now)
        for key in keys:
            table = self._table(key)
            found = table.pop(key, None) or _Failures(0, now, now)
            found.count += 1
            found.last = now
            over = found.count - self.free
            if over >= 0:
                found.allowed_at = now + min(self.cap_s, self.base_s * 2.0**over)
            table[key] = found
            self._bound(table, key, now)

    def succeeded(self, keys: Iterable[str]) -> None:
        """A successful login clears the counts of `keys`."""
        for key in keys:
            self._table(key).pop(key, None)

    def _bound(self, table: OrderedDict[str, _Failures], counted: str, now: float) -> None:
        """Hold `table` to `max_keys`: a key that delays no one goes first, the least recently
        failed delaying key only when none is left, and never `counted`, the key just counted
        (its count is still below `free` at first, so it "delays no one": dropping it let
        guessing at a new key go on unthrottled while the table was full). The `_LOOK` least
        recently failed keys are looked at first; the whole table only when each of them
        delays, which only a script that made them all delay pays for."""
        while len(table) > self._max_keys:
            idle = self._idle(itertools.islice(table.items(), _LOOK), counted, now)
            if idle is None:
                idle = self._idle(table.items(), counted, now)
            if idle is not None:
                del table[idle]
            elif next(iter(table)) != counted:
                table.popitem(last=False)
            else:
                return

    @staticmethod
    def _idle(keys: Iterable[tuple[str, _Failures]], counted: str, now: float) -> str | None:
        return next((k for k, f in keys if f.allowed_at <= now and k != counted), None)

    def _forget_old(self, table: OrderedDict[str, _Failures], now: float) -> None:
        while table:
            key, oldest = next(iter(table.items()))
            if now - oldest.last < self.cap_s or oldest.allowed_at > now:
                return
            del table[key]


def install_throttle(app: FastAPI, throttle: LoginThrottle | None = None) -> LoginThrottle:
    """The console's login throttle (`app.state.login_throttle`, which `webui.login.attempt`
    uses)."""
    chosen = throttle or LoginThrottle()
    app.state.login_throttle = chosen
    return chosen


Secret = Literal["login", "token"]


def attempt_keys(request: Request, user: str | None, secret: Secret = "login") -> list[str]:
    """The keys an attempt counts against: the client's address, and the user if named, each
    for the kind of `secret` tried ("login:addr:…", "token:addr:…").

    The address is the TCP peer's: the consoles run uvicorn without proxy headers, so a
    client cannot pick its own. Behind a reverse proxy every client shares the proxy's, and
    with one key for both kinds a script's wrong bearer tokens locked every operator out of
    the login page (and wrong passwords the scripts out of the API): each kind has its own.
    """
    address = request.client.host if request.client else "unknown"
    keys = [f"{secret}:addr:{address}"]
    if user:
        keys.append(f"{secret}:user:{user}")
    return keys


def wait_message(seconds: float) -> tuple[str, int]:
    """What a throttled client is told, and its Retry-After (whole seconds, at least 1)."""
    after = max(1, math.ceil(seconds))
    return f"Too many failed attempts. Try again in {after} s.", after
