"""Task ids as people type them: the full id, or any unique prefix of it (as a terminal or
the console shows them), resolved by the cloud (`ListTasks.task_id_prefix`) with the rules
both consoles share (`webui.id_prefixes`)."""

from __future__ import annotations

from amc.v1 import task_service_pb2
from console.cli_errors import UserError
from console.client import OperatorClient
from webui.id_prefixes import SHOWN, IdPrefixError, as_prefix, not_an_id, pick


async def resolve(client: OperatorClient, text: str) -> str:
    """The one task id `text` is or starts; a `UserError` naming the candidates otherwise."""
    given = as_prefix(text)
    if given is None:
        refused = not_an_id(text)
        raise UserError(str(refused), refused.hint)
    response: task_service_pb2.ListTasksResponse = await client.tasks.ListTasks(
        task_service_pb2.ListTasksRequest(task_id_prefix=given, page_size=SHOWN + 1)
    )
    try:
        return pick(given, [t.task_id for t in response.tasks])
    except IdPrefixError as error:
        hint = error.hint if error.candidates else "list tasks with `amc task list`"
        raise UserError(str(error), hint) from None
