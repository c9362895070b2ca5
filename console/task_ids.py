"""Task ids as people type them: the full id, or any unique prefix of it (as a terminal or
the console shows them), resolved by the cloud (`ListTasks.task_id_prefix`)."""

from __future__ import annotations

import re

from amc.v1 import task_service_pb2
from console.cli_errors import UserError
from console.client import OperatorClient

_HEX = re.compile(r"^[0-9a-fA-F]{1,32}$")
#: Candidates named in an "ambiguous" error.
SHOWN = 5


async def resolve(client: OperatorClient, text: str) -> str:
    """The one task id `text` is or starts; a `UserError` naming the candidates otherwise."""
    given = text.strip()
    if not _HEX.match(given):
        raise UserError(
            f"{text!r} is not a task id",
            "task ids are 32 hexadecimal digits; a unique prefix of one works too",
        )
    response: task_service_pb2.ListTasksResponse = await client.tasks.ListTasks(
        task_service_pb2.ListTasksRequest(task_id_prefix=given, page_size=SHOWN + 1)
    )
    found = [t.task_id for t in response.tasks]
    if not found:
        raise UserError(f"no task id starts with {given}", "list tasks with `amc task list`")
    if given.lower() in found:
        return given.lower()
    if len(found) > 1:
        more = ", …" if len(found) > SHOWN else ""
        raise UserError(
            f"task id prefix {given} is ambiguous: {', '.join(found[:SHOWN])}{more}",
            "give more characters of the id",
        )
    return found[0]
