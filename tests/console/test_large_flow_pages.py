"""A page of learned flows whose texts are at their longest: the flows page and GET /api/flows
still list it.

A flow keeps its source task's goal twice (its goal template and the text its embedding is
made of): a goal of 2,000 characters in 4-byte characters (emoji) makes a flow of about
16 kB. ListFlows filled a page with up to `page_size` flows whatever their size, so a page of
500 (the largest the console asks for) passed the 4 MiB the console's gRPC channel reads, and
the page answered 429 "Received message larger than max" (RESOURCE_EXHAUSTED) every time.
Proves, against a cloud of its own and the real gateway: the API's pages of 500, followed by
their tokens, list every flow once, newest first, and the flows page of 500 renders.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cloud.store import flows
from tests.console.console_stack import API_TOKEN, cloud_of_its_own
from tests.console.test_pages import log_in
from tests.support.flows import dark_theme_flow

FLOWS = 500
EMOJI = "\U0001f600"


@pytest.fixture
def long_flows(tmp_path: Path, pki_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """A gateway (its base URL) over a cloud of its own holding the flows (their ids, newest
    first)."""
    with cloud_of_its_own(tmp_path, pki_dir, "flows") as (loop, server, base):
        ids: list[str] = []
        for i in range(FLOWS):
            goal = EMOJI * 1996 + f"{i:04d}"
            flow = dark_theme_flow()
            flow.goal_template = flow.embedding_text = goal
            row, _ = loop.run(flows.add(server.store, flow, f"long-{i}", f"t-{i}", 1))
            ids.insert(0, row.flow_id)
        yield base, ids


def test_a_page_of_flows_with_the_longest_texts_still_lists(
    long_flows: tuple[str, list[str]],
) -> None:
    base, ids = long_flows
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as api:
        listed: list[str] = []
        token = ""
        for _ in range(FLOWS):
            page = api.get("/api/flows", params={"page_size": 500, "page_token": token})
            assert page.status_code == 200, page.text[:300]
            body = page.json()
            listed += [f["flow_id"] for f in body["flows"]]
            token = body["next_page_token"]
            if not token:
                break
        assert sorted(listed) == sorted(ids) and len(listed) == len(set(listed))

    with httpx.Client(base_url=base, timeout=60) as person:
        assert log_in(person, "/flows").status_code == 303
        page = person.get("/flows", params={"page_size": 500})
        assert page.status_code == 200, page.text[:300]
        shown = re.findall(r'href="/flows/([0-9a-f]{16})"', page.text)
        assert shown and set(shown) <= set(ids)
