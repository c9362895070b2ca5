"""PlannerService on the cloud: the planner's servicer on the cloud's ports, for hosts only.

The planner (`planner.service`) knows nothing of the cloud: it is handed who the caller is, a
`LeaseGate`, a `DecisionSink` and a session store. This wires those to the cloud's store and
adds the one rule only the cloud can know: a host may plan only on its own leases. Who may call
Decide at all (hosts) is `cloud.authz`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import grpc
from sqlalchemy import exc as sa_exc

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc
from cloud import authz
from cloud.events import EventBus
from cloud.lease.validate import MAX_ID
from cloud.provider_health import ProviderHealth
from cloud.services.status import abort
from cloud.settings import SettingError
from cloud.store import leases
from cloud.store.database import Store
from cloud.store.ports import (
    FlowsHanded,
    StoreAttemptLog,
    StoreDecisionSink,
    StoreLeaseGate,
    StoreSessionStore,
)
from planner.errors import WAITING_FOR_KEY
from planner.vendors.base import Probeable

if TYPE_CHECKING:  # imported when the servicer is built, like the rest of the planner
    from planner.service import PlannerServicer

log = logging.getLogger(__name__)

#: What a host is told while the database cannot be reached: it asks again, the step waits.
DATABASE_UNAVAILABLE = "the cloud's database is unavailable; retry"
_UNREACHABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    ConnectionError,
)


def _database_unreachable(exc: BaseException) -> bool:
    """The database cannot be reached right now (restarting, a dropped connection, no pool
    connection in time): retrying helps. Told by type, never by the driver's text."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, _UNREACHABLE)


class OwnLeasesOnly(planner_service_pb2_grpc.PlannerServiceServicer):
    """Refuses a Decide on another host's lease before the planner sees it (PERMISSION_DENIED:
    "lease … of task … belongs to another host"); anything else goes to the planner.

    A database that cannot be reached at any point of the call is UNAVAILABLE with a generic
    message (never the driver's text: it names the database's host and port), so the host's
    step waits and asks again instead of failing its task.
    """

    def __init__(self, inner: PlannerServicer, store: Store) -> None:
        self._inner = inner
        self._store = store

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        try:
            return await self._decide(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if not _database_unreachable(exc):
                raise
            log.warning("Decide: the database is unavailable (%s)", type(exc).__name__)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                DATABASE_UNAVAILABLE,
                ((WAITING_FOR_KEY, "the cloud's database"),),
            )
            raise AssertionError("abort returns only by raising") from exc  # pragma: no cover

    async def _decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        if len(request.lease_id) <= MAX_ID:  # a longer one is no lease: the planner says so
            # Another host's lease is not "not live" but none of this host's business.
            owner = await leases.lease_owner(
                self._store, request.task_id[:MAX_ID], request.attempt, request.lease_id
            )
            if owner is not None and owner != authz.caller().name:
                await abort(
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"lease {request.lease_id!r} of task {request.task_id!r} belongs to "
                    "another host",
                )
        return await self._inner.Decide(request, context)


def _caller_host_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    who = authz.caller()
    return who.name if who.kind == "host" else ""


def build_planner_servicer(
    store: Store,
    bus: EventBus,
    health: ProviderHealth | None = None,
    handed: FlowsHanded | None = None,
) -> tuple[planner_service_pb2_grpc.PlannerServiceServicer, list[Any], str]:
    """The planner servicer on the cloud's ports, what must be closed with the server, and a
    line saying which planner it is (for the start-up banner).

    The planner settings (`AMC_PLANNER_*`, read here) choose the provider and the mode hosts'
    typed requests are planned in (`AMC_PLANNER_MODE`, compact by default). Session mode needs a
    provider that keeps conversations: asking for it with the offline provider is a
    `SettingError`; deprecated session steps get UNIMPLEMENTED there, as before. `health` hears
    every Decide's outcome and gets the model's probe (the offline provider has none: it is
    never down). `handed` reads the learned flows an attempt was given (replayed inside
    Decide); None: no replay.
    """
    from planner.planner import make_planner
    from planner.service import PlannerServicer
    from planner.settings import PlannerSettings

    planner_settings = PlannerSettings()
    planner = make_planner(planner_settings)
    if health is not None and isinstance(planner.provider, Probeable):
        health.probe = planner.provider.probe
    sessions = None
    if planner_settings.resolved_provider != "offline":
        from planner.session.factory import SessionPlanners  # loads the provider SDKs

        sessions = SessionPlanners(planner_settings, adapter=planner.provider)
    if planner_settings.mode == "session" and sessions is None:
        raise SettingError(
            "AMC_PLANNER_MODE",
            "session mode needs a provider that keeps a conversation, and the planner is offline",
            "set AMC_PLANNER_PROVIDER=anthropic or openai (with its API key), or "
            "AMC_PLANNER_MODE=compact",
        )
    inner = PlannerServicer(
        caller_host_id=_caller_host_id,
        lease_gate=StoreLeaseGate(store),
        sink=StoreDecisionSink(store),
        planner=planner,
        attempts=StoreAttemptLog(store, handed),
        mode=planner_settings.mode,
        sessions=sessions,
        session_store=lambda: StoreSessionStore(store),
        live_thinking=bus.thinking,
        health=health,
    )
    closeables: list[Any] = [planner] if sessions is None else [planner, sessions]
    summary = (
        f"{planner_settings.resolved_provider} (model {planner_settings.resolved_model}, "
        f"{planner_settings.mode} mode; AMC_PLANNER_* settings)"
    )
    return OwnLeasesOnly(inner, store), closeables, summary
