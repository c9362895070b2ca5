"""The offline provider: a deterministic planner that needs no network, a general heuristic
agent, not a script.

It reads goal, scene and compact history back from the user prompt text (`parse_user_prompt`), so
it behaves the same in-process and behind the cloud's Decide service. Each turn it:

* judges the previous step (did the page change as its expected outcome said?);
* completes when the goal's target state is on screen (the switch the goal names is on/off as
  asked, the page the goal names is open, the values it asked to enter are shown after saving);
* fills form fields with values taken from the goal text (quoted strings, "named X", "phone
  555…", times "7:30"), matching each field's hint or id to the kind of value, then saves;
* otherwise taps the element whose label (its text, description, or the texts inside its row,
  such as a settings entry's summary) best matches the goal's words, opening the matching app
  from a launcher; it never re-taps what it already tried on that page and does not go back into
  pages it backed out of;
* scrolls when nothing matches, and backs out of dead ends.

It knows a little general Android vocabulary (dark theme lives under display, Wi-Fi under network,
an alarm in a clock app) the way any model does; it knows nothing about a particular task suite.

The package holds the agent by job: `goal` (what the goal asks for), `screen` (what the scene
shows), `memory` (what earlier turns did, read from the history), `tactics` (one turn's choice)
and `provider` (the `Provider` protocol and compound goals).
"""

from __future__ import annotations

from planner.providers.offline.goal import split_goal
from planner.providers.offline.provider import MODEL, OfflineProvider
from planner.providers.offline.tactics import MAX_STEPS

__all__ = ["MAX_STEPS", "MODEL", "OfflineProvider", "split_goal"]
