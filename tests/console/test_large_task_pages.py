"""A page of tasks whose texts are at their longest, each task within every limit: the tasks
page and GET /api/tasks still list it.

A goal may hold 2,000 characters and a client request id 128, in any script: in 4-byte
characters (emoji) with a 128-character target host and phone serial (ASCII), about 8.9 kB a
task. ListTasks filled a page with up to `page_size` tasks whatever their size, so a page of
500 (the largest the console asks for) passed the 4 MiB the console's gRPC channel reads,
and the page answered 429 "Received message larger than max" (RESOURCE_EXHAUSTED) every
time. Proves, against a cloud of its own (500 such tasks would crowd other tests' listings)
and the real gateway: the API's pages of 500, followed by their tokens, list every task once,
newest first, and the tasks page of 500 renders.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from amc.v1 import task_service_pb2, task_service_pb2_grpc, types_pb2
from tests.console.console_stack import (
    API_TOKEN,
    WAIT_S,
    channel_credentials,
    cloud_of_its_own,
)
from tests.console.test_pages import log_in

TASKS = 500
EMOJI = "\U0001f600"


@pytest.fixture
def long_tasks(tmp_path: Path, pki_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """A gateway (its base URL) over a cloud of its own holding the tasks (their ids, newest
    first)."""
    ids: list[str] = []
    with cloud_of_its_own(tmp_path, pki_dir, "tasks") as (_, server, base):
        channel = grpc.secure_channel(
            server.address, channel_credentials(pki_dir, "operator-tester")
        )
        try:
            stub = task_service_pb2_grpc.TaskServiceStub(channel)
            target = types_pb2.TaskTarget(host_id="h" * 128, device_serial="s" * 128)
            for i in range(TASKS):
                response = stub.SubmitTask(
                    task_service_pb2.SubmitTaskRequest(
                        goal=EMOJI * 1996 + f"{i:04d}",
                        target=target,
                        client_request_id=EMOJI * 124 + f"{i:04d}",
                    ),
                    timeout=WAIT_S,
                )
                ids.insert(0, response.task.task_id)
            yield base, ids
        finally:
            channel.close()


def test_a_page_of_tasks_with_the_longest_texts_still_lists(
    long_tasks: tuple[str, list[str]],
) -> None:
    base, ids = long_tasks
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as api:
        listed: list[str] = []
        token = ""
        for _ in range(TASKS):
            page = api.get("/api/tasks", params={"page_size": 500, "page_token": token})
            assert page.status_code == 200, page.text[:300]
            body = page.json()
            listed += [t["task_id"] for t in body["tasks"]]
            token = body["next_page_token"]
            if not token:
                break
        assert listed == ids

    with httpx.Client(base_url=base, timeout=60) as person:
        assert log_in(person, "/tasks").status_code == 303
        tasks = person.get("/tasks", params={"page_size": 500})
        assert tasks.status_code == 200, tasks.text[:300]
        shown = re.findall(r'data-task-id="([0-9a-f]{32})"', tasks.text)
        assert shown and shown == ids[: len(shown)]
