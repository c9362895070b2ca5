"""Lease queries: claim, fenced renewal and result, expiry and deadline sweeps, releases,
liveness checks.

A package split along those jobs (`claim`, `renew`, `results`, `sweeps`, `release`, `queries`,
with the fence in `fence` and the progress snapshot in `progress`); callers keep `leases.x`.
Everything here returns the store's own types (rows, dataclasses, `Revocation`): the lease
service maps them to the protocol's messages.
"""

from cloud.store.leases.claim import (
    Claimed,
    Settle,
    Waiting,
    claim,
    latest_progress,
    live_attempts_on,
    waiting,
)
from cloud.store.leases.fence import Revocation, classify, live_fence
from cloud.store.leases.progress import (
    RESULT_SUMMARY_LIMIT,
    SUMMARY_LIMIT,
    ProgressIn,
    truncate_summary,
)
from cloud.store.leases.queries import (
    BusyPhone,
    HeldCheck,
    HeldLease,
    RecentLease,
    busy_phones,
    held_recently,
    is_live,
    lease_owner,
    live_serials_by_host,
)
from cloud.store.leases.release import release
from cloud.store.leases.renew import (
    ALWAYS_WRITE,
    Must,
    RenewalIn,
    RenewalOut,
    answer_from_read,
    lease_key,
    renew_batch,
    write_renewals,
)
from cloud.store.leases.results import ReplayIn, ResultOut, record_result
from cloud.store.leases.resume import HelloIn, Settled, hellos, resume, settle_hellos
from cloud.store.leases.sweeps import (
    Ended,
    Skipped,
    extend_after_outage,
    keep_time_left,
    sweep_deadlines,
    sweep_expired,
)

__all__ = [
    "ALWAYS_WRITE",
    "RESULT_SUMMARY_LIMIT",
    "SUMMARY_LIMIT",
    "BusyPhone",
    "Claimed",
    "Ended",
    "HeldCheck",
    "HeldLease",
    "HelloIn",
    "Must",
    "ProgressIn",
    "RecentLease",
    "RenewalIn",
    "RenewalOut",
    "ReplayIn",
    "ResultOut",
    "Revocation",
    "Settle",
    "Settled",
    "Skipped",
    "Waiting",
    "answer_from_read",
    "busy_phones",
    "claim",
    "classify",
    "extend_after_outage",
    "held_recently",
    "hellos",
    "is_live",
    "keep_time_left",
    "latest_progress",
    "lease_key",
    "lease_owner",
    "live_attempts_on",
    "live_fence",
    "live_serials_by_host",
    "record_result",
    "release",
    "renew_batch",
    "resume",
    "settle_hellos",
    "sweep_deadlines",
    "sweep_expired",
    "truncate_summary",
    "waiting",
    "write_renewals",
]
