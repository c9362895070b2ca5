"""How many connections a PostgreSQL replica opens: its pool, and those of its own.

Every replica of a database counts against the server's `max_connections` (100 by default)
with its whole pool at its busiest, so the pool's ceiling is a setting
(`AMC_CLOUD_DATABASE_POOL_SIZE`): three replicas at the default 30 (+ `OWN_CONNECTIONS` each)
were already 99. No imports: the settings class reads these without loading the store.
"""

from __future__ import annotations

#: The pool's ceiling unless set: 10 kept open, 20 more while calls need them (what every
#: replica had before it was a setting).
DEFAULT_POOL_SIZE = 30
#: The least the setting may be. The pool serves every call and every background job that is
#: not on a connection of its own: the sweeps, the dispatcher's claims, the database probe, the
#: deny-list refresh and the metrics refresh may each hold one at the same moment, and a
#: call that finds none free waits for one up to the pool's 30 s timeout. Below five the jobs
#: alone can take them all. Measured at five: a dispatch burst of 1,000 hosts on 1,000 queued
#: tasks (bench/dispatch_burst.py --pool-size 5) assigned every task once, its last assignment
#: 1.6 s and 10.9 s after the last hello where the default 30 took 0.9 s and 11.3 s in the same
#: loaded runs (with 2,000 older tasks to pass over: 1.2-3.7 s against 1.8 s;
#: docs/benchmarks.md): calls queue for a connection, none waits out the timeout.
MIN_POOL_SIZE = 5
#: Connections a PostgreSQL replica opens besides its pool: the renewal batch's read and write
#: and the event bus's NOTIFYs (`cloud.store.direct`), the bus's LISTEN, and the replica's
#: presence lock (`cloud.store.replicas`; a short second one at start).
OWN_CONNECTIONS = 5


def pool_split(size: int) -> tuple[int, int]:
    """SQLAlchemy's `pool_size` (kept open) and `max_overflow` (opened while needed, closed
    when returned) for a ceiling of `size`: a third kept, as the fixed 10 + 20 were."""
    kept = max(1, size // 3)
    return kept, size - kept
