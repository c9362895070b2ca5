"""FleetService: ListHosts, and WatchHosts (a snapshot, then every host change, of the fleet or
of one ListHosts page). Operators only."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from amc.v1 import fleet_service_pb2 as pb
from amc.v1 import fleet_service_pb2_grpc, types_pb2
from cloud.events import EventBus
from cloud.lease.validate import MAX_ID
from cloud.metrics import start_of_day
from cloud.provider_health import ProviderHealth
from cloud.services.decision_log_service import fitting
from cloud.services.status import abort, check_ids
from cloud.settings import CloudSettings
from cloud.store import convert, holds, hosts, leases, paging, spend
from cloud.store.database import Store
from cloud.store.holds import Hold
from cloud.store.models import HostRow
from planner.convert import usage_to_proto

# Changed hosts loaded per query.
_CHUNK = 200
DEFAULT_PAGE = 100
MAX_PAGE = 500
#: GetSpend answers at most this many days at once.
MAX_SPEND_DAYS = 366


#: The store's filter of each ListHostsRequest.connection.
_CONNECTIONS = {
    pb.HOST_CONNECTION_UNSPECIFIED: hosts.ANY,
    pb.HOST_CONNECTION_CONNECTED: hosts.CONNECTED,
    pb.HOST_CONNECTION_DISCONNECTED: hosts.DISCONNECTED,
}

#: DispatchStatus.kind of each hold in `dispatch_holds`.
_KINDS = {
    holds.PROVIDER_DOWN: pb.DISPATCH_HOLD_KIND_PROVIDER_DOWN,
    holds.KEY_REFUSED: pb.DISPATCH_HOLD_KIND_KEY_REFUSED,
    holds.DAILY_BUDGET: pb.DISPATCH_HOLD_KIND_DAILY_BUDGET,
}


def _day(field: str, text: str) -> dt.datetime:
    """A YYYY-MM-DD day as midnight UTC; ValueError naming the field otherwise."""
    try:
        day = dt.date.fromisoformat(text) if len(text) == 10 else None
    except ValueError:
        day = None
    if day is None:
        raise ValueError(f"{field}: {text[:40]!r} is not a day (YYYY-MM-DD)")
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


def _listing(flt: hosts.HostFilter) -> str:
    """The page tokens' listing name: ListHosts with this filter (a token continued under
    another filter would skip that filter's hosts without a word). "hosts-by-id/": tokens of
    the earlier order (connected first; "hosts/", or a bare `[rank, host_id]`) held a position
    in it, which read as a place in this one would skip or repeat hosts; they are refused."""
    named: list[object] = [flt.connection == hosts.CONNECTED, flt.query.lower()]
    named.append(sorted(flt.host_ids or ()))
    if flt.connection == hosts.DISCONNECTED:
        # Appended, so the tokens of the listings that were already there stay valid.
        named.append(hosts.DISCONNECTED)
    return "hosts-by-id/" + hashlib.sha256(json.dumps(named).encode()).hexdigest()[:16]


async def _token_start(
    context: grpc.aio.ServicerContext[Any, Any], flt: hosts.HostFilter, token: str
) -> str | None:
    """`_after` for a request's page token, or None without one: a token not of this listing
    aborts INVALID_ARGUMENT "page_token: …" (ListHosts and a scoped WatchHosts alike)."""
    if not token:
        return None
    try:
        return _after(flt, token)
    except ValueError as exc:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")


def _after(flt: hosts.HostFilter, token: str) -> str:
    """The host id a page token continues after; ValueError (a `paging` message) for a token
    of another listing or none of this server's."""
    (host_id,) = paging.position(_listing(flt), token, 1)
    return paging.token_id(host_id, MAX_ID)


async def _connection(context: grpc.aio.ServicerContext[object, object], value: int) -> str:
    """The store's filter of a request's `connection`; INVALID_ARGUMENT naming the values
    this server knows for any other."""
    connection = _CONNECTIONS.get(value)  # type: ignore[call-overload]
    if connection is None:
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"connection: unknown value {value}; one of "
            + ", ".join(pb.HostConnection.Name(v) for v in _CONNECTIONS),
        )
    return str(connection)


@dataclass(frozen=True, slots=True)
class _Watched:
    """What one WatchHosts call covers: the filter, and the page's range of ids (after
    `after`, up to `through`; None: no bound)."""

    flt: hosts.HostFilter
    after: str | None = None
    through: str | None = None

    def covers(self, host_id: str) -> bool:
        """Whether a change of `host_id` may concern this watch (its connection aside, which
        only its row tells). Python compares str by code point, as the pages' order does."""
        if self.flt.host_ids is not None and host_id not in self.flt.host_ids:
            return False
        if self.after is not None and host_id <= self.after:
            return False
        return self.through is None or host_id <= self.through

    def keeps(self, connected: bool) -> bool:
        """Whether a host with this connection is in the filter."""
        if self.flt.connection == hosts.ANY:
            return True
        return connected == (self.flt.connection == hosts.CONNECTED)


class FleetServicer(fleet_service_pb2_grpc.FleetServiceServicer):
    """Hosts and their phones, by id; live changes to them."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        settings: CloudSettings,
        provider: ProviderHealth | None = None,
        budget_hold: Callable[[], Awaitable[Hold | None]] | None = None,
    ) -> None:
        self._store = store
        self._bus = bus
        self._settings = settings
        self._provider = provider
        self._budget_hold = budget_hold

    async def ListHosts(
        self,
        request: pb.ListHostsRequest,
        context: grpc.aio.ServicerContext[pb.ListHostsRequest, pb.ListHostsResponse],
    ) -> pb.ListHostsResponse:
        if not 0 <= request.page_size <= MAX_PAGE:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_size: 0 to {MAX_PAGE}")
        if len(request.host_query) > MAX_ID:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"host_query: at most {MAX_ID} characters",
            )
        await check_ids(context, "host_ids", request.host_ids, MAX_PAGE)
        connection = await _connection(context, request.connection)
        if request.connected_only:
            if connection == hosts.DISCONNECTED:
                await abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "connected_only: contradicts connection HOST_CONNECTION_DISCONNECTED",
                )
            connection = hosts.CONNECTED
        flt = hosts.HostFilter(
            connection=connection,
            query=request.host_query,
            host_ids=tuple(request.host_ids) or None,
        )
        after = await _token_start(context, flt, request.page_token)
        page, listed, more = await self._page(flt, request.page_size or DEFAULT_PAGE, after)
        last = page[-1] if page else None
        return pb.ListHostsResponse(
            hosts=listed,
            next_page_token=(
                paging.page_token(_listing(flt), last[0].host_id) if more and last else ""
            ),
            dispatch=await self._dispatch(),
        )

    async def _dispatch(self) -> pb.DispatchStatus:
        """The holds as the database has them now (another replica may have set or lifted one
        since this replica's last dispatch pass)."""
        if self._provider is not None:
            await self._provider.holds.refresh()
        pause = self._provider.pause if self._provider is not None else None
        held = await self._budget_hold() if self._budget_hold is not None else None
        if pause is None and held is not None:
            seen = f" (seen by replica {held.set_by})" if held.set_by else ""
            return pb.DispatchStatus(
                paused=True,
                reason=f"the fleet's daily model budget is spent since {held.set_at:%H:%M:%S} "
                f"UTC{seen}: {held.detail}; dispatch resumes at 00:00 UTC, or once the cloud "
                "runs with a higher AMC_CLOUD_DAILY_MAX_TOKENS / AMC_CLOUD_DAILY_MAX_COST_USD "
                "(a setting: restart each replica with it)",
                since=convert.ts(held.set_at),
                kind=_KINDS[holds.DAILY_BUDGET],
                seen_by=held.set_by,
                lifted_by="00:00 UTC, or a replica restarted with a higher "
                "AMC_CLOUD_DAILY_MAX_TOKENS / AMC_CLOUD_DAILY_MAX_COST_USD",
                resumes_at=convert.ts(start_of_day(self._store.now()) + dt.timedelta(days=1)),
            )
        if pause is None:
            return pb.DispatchStatus()
        status = pb.DispatchStatus(
            paused=True,
            reason=pause.describe(),
            since=convert.ts(pause.since),
            kind=_KINDS[pause.kind],
            seen_by=pause.seen_by,
            lifted_by=pause.lifted_by(),
        )
        if pause.next_probe_at is not None:
            status.next_probe_at.CopyFrom(convert.ts(pause.next_probe_at))
        return status

    async def GetSpend(
        self,
        request: pb.GetSpendRequest,
        context: grpc.aio.ServicerContext[pb.GetSpendRequest, pb.GetSpendResponse],
    ) -> pb.GetSpendResponse:
        today = start_of_day(self._store.now())
        since, until = today, today
        try:
            if request.since_day:
                since = _day("since_day", request.since_day)
            if request.until_day:
                until = _day("until_day", request.until_day)
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if since > until:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "since_day: after until_day")
        if (until - since).days >= MAX_SPEND_DAYS:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"since_day..until_day: at most {MAX_SPEND_DAYS} days",
            )
        # The end of `until_day`: 9999-12-31 has no next day to start it.
        end = until + dt.timedelta(days=1) if until.date() < dt.date.max else dt.datetime.max
        rows = await spend.spend_rows(self._store, since, end.replace(tzinfo=dt.UTC))
        s = self._settings
        return pb.GetSpendResponse(
            rows=[
                pb.SpendRow(
                    day=r.day,
                    host_id=r.host_id,
                    provider=r.provider,
                    model=r.model,
                    usage=usage_to_proto(r.usage),
                    decisions=r.decisions,
                )
                for r in rows
            ],
            today=usage_to_proto(await spend.spent_since(self._store, today)),
            daily_budget=types_pb2.TaskBudget(
                max_tokens=s.daily_max_tokens, max_cost_usd=s.daily_max_cost_usd
            ),
        )

    async def WatchHosts(
        self,
        request: pb.WatchHostsRequest,
        context: grpc.aio.ServicerContext[pb.WatchHostsRequest, pb.WatchHostsResponse],
    ) -> AsyncIterator[pb.WatchHostsResponse]:
        """The snapshot is one ListHosts page read as ListHosts reads it, or, for a watch
        without a page size (as every watch was), the whole filter in pages of MAX_PAGE in
        id order: it loaded every host row at once and sorted them in Python, for each
        console tab, though the tab showed fifty (issue 21: 10,000 hosts on one replica)."""
        if len(request.host_id) > MAX_ID:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"host_id: at most {MAX_ID} characters"
            )
        if not 0 <= request.page_size <= MAX_PAGE:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_size: 0 to {MAX_PAGE}")
        flt = hosts.HostFilter(
            connection=await _connection(context, request.connection),
            host_ids=(request.host_id,) if request.host_id else None,
        )
        after = await _token_start(context, flt, request.page_token)
        # Subscribe before reading the snapshot so no change falls between the two.
        sub = self._bus.subscribe_hosts()
        # What this watcher was last sent per host in the filter: a change that leaves a host
        # as it was (an event for a host another event already covered) is not sent twice.
        sent: dict[str, types_pb2.Host] = {}
        try:
            watched = _Watched(flt, after)
            next_token = ""
            if request.page_size:
                page, _, more = await self._page(flt, request.page_size, after)
                if more and page:
                    watched = _Watched(flt, after, page[-1][0].host_id)
                    next_token = paging.page_token(_listing(flt), page[-1][0].host_id)
                snapshot = _chunks([page])
            else:
                snapshot = self._walk(watched)
            async for rows in snapshot:
                for host in await self._hosts(rows):
                    sent[host.host_id] = host
                    yield pb.WatchHostsResponse(host=host, snapshot=True)
            yield pb.WatchHostsResponse(snapshot_complete=True, next_page_token=next_token)
            while True:
                changed = await sub.next()
                for rows in await self._changed(watched, changed, sent):
                    for host in await self._hosts(rows):
                        if watched.keeps(host.connected):
                            if sent.get(host.host_id) == host:
                                continue
                            sent[host.host_id] = host
                        elif sent.pop(host.host_id, None) is None:
                            continue  # outside the filter, and the watcher was not told of it
                        yield pb.WatchHostsResponse(host=host)
        finally:
            sub.close()

    @property
    def _heartbeat(self) -> float:
        return self._settings.host_heartbeat_seconds

    async def _page(
        self, flt: hosts.HostFilter, page_size: int, after: str | None
    ) -> tuple[list[tuple[HostRow, bool]], list[types_pb2.Host], bool]:
        """A page of hosts (rows, as the API shows them, whether more follow) as ListHosts
        lists it and WatchHosts scopes it: `page_size` hosts, fewer where they would pass
        what a default gRPC client reads. A host may report a megabyte of phones (256, each
        with a long serial and reason): four of them made the page a console could not read."""
        page, more = await hosts.hosts_page(self._store, self._heartbeat, flt, page_size, after)
        listed = await self._hosts(page)
        kept = fitting(listed)
        if kept < len(page):
            return page[:kept], listed[:kept], True
        return page, listed, more

    async def _walk(self, watched: _Watched) -> AsyncIterator[list[tuple[HostRow, bool]]]:
        """Every host a watch covers, by id, MAX_PAGE rows per query (ListHosts' query, on
        its index)."""
        after = watched.after
        while True:
            page, more = await hosts.hosts_page(
                self._store, self._heartbeat, watched.flt, MAX_PAGE, after, through=watched.through
            )
            yield page
            if not more or not page:
                return
            after = page[-1][0].host_id

    async def _changed(
        self, watched: _Watched, changed: set[str] | None, sent: dict[str, types_pb2.Host]
    ) -> list[list[tuple[HostRow, bool]]]:
        """The rows of the hosts a change may concern, in chunks: those of `changed` the watch
        covers, or (None: anything may have changed) every host it covers plus those it was
        sent, which may have left its filter."""
        if changed is None:
            found = [rows async for rows in self._walk(watched)]
            ids = set(sent).difference(row.host_id for rows in found for row, _ in rows)
        else:
            found = []
            ids = {h for h in changed if watched.covers(h)}
        ordered = sorted(ids)
        for i in range(0, len(ordered), _CHUNK):
            found.append(
                await hosts.list_hosts(self._store, self._heartbeat, ordered[i : i + _CHUNK])
            )
        return found

    async def _hosts(self, rows: list[tuple[HostRow, bool]]) -> list[types_pb2.Host]:
        """These hosts as the API shows them, with their busy phones."""
        busy = await leases.busy_phones(self._store, [row.host_id for row, _ in rows])
        now = self._store.now()
        return [convert.host(row, connected, busy.get(row.host_id), now) for row, connected in rows]


async def _chunks(
    chunks: list[list[tuple[HostRow, bool]]],
) -> AsyncIterator[list[tuple[HostRow, bool]]]:
    """Chunks already read, as `FleetServicer._walk` yields them."""
    for chunk in chunks:
        yield chunk
