"""What answers a model call: a vendor adapter (`planner/vendors/`) or the offline heuristic."""

from __future__ import annotations

from planner.settings import PlannerSettings
from planner.vendors.base import ModelAdapter

__all__ = ["make_provider"]


def make_provider(settings: PlannerSettings) -> ModelAdapter:
    """The model the settings select (see `PlannerSettings.resolved_provider`).

    Raises `PlannerAuthError` when a vendor is selected without its API key, so a
    misconfiguration shows up at start-up rather than at the first step.
    """
    if settings.resolved_provider == "offline":
        from planner.prices import PriceTable
        from planner.providers.offline import OfflineProvider
        from planner.vendors.observed import observed

        return observed(OfflineProvider(), PriceTable.load(settings.prices_file))
    from planner.vendors import make_adapter

    return make_adapter(settings)
