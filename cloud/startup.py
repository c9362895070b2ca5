"""What `amc cloud serve` tells the person who starts it.

Once it is up: where it listens, which store, which planner, where the certificates came from.
When it cannot start: one line naming the setting and the fix (`SettingError`), not a
traceback — the traceback is behind `--debug`. Settings errors are found where they arise
(`CloudSettings.tls_paths`, the bind, the database URL) or translated here from the
libraries' exceptions (pydantic's validation, a database that cannot be reached).
"""

from __future__ import annotations

import asyncio
import sys
import traceback

from pydantic import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from cloud.lease.clock import ClockSkew
from cloud.server import Say, serve
from cloud.settings import CloudSettings, SettingError, validation_problem
from cloud.store import errors
from cloud.store.engine import SchemaMismatch
from planner.errors import PlannerAuthError, PlannerConfigError
from telemetry.redaction import scrub, shown_url
from telemetry.tracing import TracingConfigError


def explain(exc: BaseException, settings: CloudSettings | None = None) -> str | None:
    """One line for a startup failure a setting explains, or None for anything else."""
    if isinstance(exc, SettingError | PlannerConfigError):
        return str(exc)
    if isinstance(exc, PlannerAuthError):  # no key configured for the provider chosen
        return f"{exc}; or run without a model: AMC_PLANNER_PROVIDER=offline"
    if isinstance(exc, TracingConfigError):
        return f"tracing: {exc}"
    if isinstance(exc, ValidationError):
        problem, fix = validation_problem(exc)
        return f"{problem}; {fix} (see docs/deployment.md)"
    if isinstance(exc, ClockSkew):
        return str(exc)
    if isinstance(exc, SchemaMismatch):
        return _schema_line(exc)
    if isinstance(exc, DBAPIError | OSError) and settings is not None:
        url = shown_url(make_url(settings.database_url))
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return str(
            SettingError(
                "AMC_CLOUD_DATABASE_URL",
                f"cannot open the database {url}: {reason}",
                errors.cause(exc) or "check that it is reachable and the credentials are right",
            )
        )
    return None


def _schema_line(exc: SchemaMismatch) -> str:
    """The refusal of a database an older release left, with what to run instead."""
    fix = (
        "upgrade it first (one replica with AMC_CLOUD_MIGRATE_ON_START=true, or"
        " `alembic upgrade head` of this release)"
    )
    return str(SettingError("AMC_CLOUD_DATABASE_URL", str(exc), fix))


def run(*, insecure: bool, debug: bool, say: Say) -> int:
    """`amc cloud serve`: 0 after a clean stop, 2 when a setting keeps it from starting."""
    settings: CloudSettings | None = None
    try:
        settings = CloudSettings()
        if insecure:
            settings.insecure = True
        asyncio.run(serve(settings, say))
        return 0
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        # Scrubbed as log lines are (`telemetry.redaction`): a library's text may quote a
        # configured secret.
        if debug:
            print(scrub(traceback.format_exc()), end="", file=sys.stderr)
        line = explain(exc, settings)
        if line is None:
            line = f"unexpected {type(exc).__name__}: {exc}"
        hint = "" if debug else " (run with --debug for the traceback)"
        print(scrub(f"amc cloud serve: {line}{hint}"), file=sys.stderr)
        return 2
