"""The largest field `PlannerService.Decide` takes, and the message limit that lets them through.

Apart from `planner.service` (the cloud's Decide, which loads the planner engine) so a host that
sends Decide, or ships the prompts a model read, checks the same limits without loading it.
"""

from __future__ import annotations

from planner.observation import MAX_OBSERVATION_BYTES

MAX_SYSTEM_PROMPT = 64 * 1024
MAX_USER_PROMPT = 512 * 1024
MAX_SCREENSHOT = 8 * 1024 * 1024
MAX_GOAL = 16 * 1024
MAX_SCENE_JSON = 512 * 1024
MAX_TOOL_OUTPUT = 512 * 1024
MAX_SHORT_FIELD = 1024
# gRPC's default 4 MiB receive limit would reject a legal screenshot before `Decide` could name
# the field: servers and clients of this service set both message limits to this.
MAX_MESSAGE_BYTES = (
    MAX_SCREENSHOT + MAX_USER_PROMPT + MAX_SYSTEM_PROMPT + MAX_OBSERVATION_BYTES + 1024 * 1024
)
