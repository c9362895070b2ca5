"""A fleet whose hosts report much about their phones, each host within every limit: its
pages still list, on the console's pages and in its API.

A host may report 256 phones, each with a 128-character serial and a 1,024-character reason
(why it cannot use the phone): over a megabyte. ListHosts filled a page with up to
`page_size` hosts whatever their size, so four such hosts made a page over the 4 MiB the
console's gRPC channel takes, and the fleet page and GET /api/hosts answered 429 "Received
message larger than max" (RESOURCE_EXHAUSTED, as if the operator were calling too often) for
every operator, for good. Proves, against a real cloud of its own (its big hosts would push
other tests' hosts off their pages) and the real gateway: the fleet page renders, the API's
pages, followed by their tokens, list every host once, in order, and a page's live stream
ends its range where the page ends (else the page would watch again and again).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cloud import pki as cloud_pki
from tests.console.console_stack import API_TOKEN, SimHost, cloud_of_its_own
from tests.console.test_api import sse_events
from tests.console.test_pages import log_in

#: Four hosts of 256 phones, each phone's serial and reason at their longest in 4-byte
#: characters: about 1.2 MB a host, 4.7 MB together.
HOSTS = 4
PHONES = 256
EMOJI = "\U0001f600"


@pytest.fixture
def big_fleet(tmp_path: Path, pki_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """A gateway (its base URL) over a cloud of its own holding the big hosts (their ids)."""
    hosts: list[SimHost] = []
    with cloud_of_its_own(tmp_path, pki_dir, "big") as (_, server, base):
        try:
            for n in range(HOSTS):
                host_id = f"big-{n}"
                cloud_pki.write_host_cert(pki_dir, host_id)
                serials = tuple(EMOJI * 125 + f"{i:03d}" for i in range(PHONES))
                host = SimHost(server.address, pki_dir, host_id, serials=serials)
                hosts.append(host)
                host.connect(reason=EMOJI * 1024)
            yield base, [h.host_id for h in hosts]
        finally:
            for host in hosts:
                host.close()


def test_a_fleet_of_hosts_with_long_phone_reports_still_lists(
    big_fleet: tuple[str, list[str]],
) -> None:
    base, host_ids = big_fleet
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as api:
        listed: list[str] = []
        first_page: list[str] = []
        token = ""
        for _ in range(HOSTS):
            page = api.get("/api/hosts", params={"page_size": 500, "page_token": token})
            assert page.status_code == 200, page.text[:300]
            body = page.json()
            assert body["hosts"], "a page with a token after it holds at least one host"
            listed += [h["host_id"] for h in body["hosts"]]
            first_page = first_page or listed[:]
            assert all(len(h["devices"]) == PHONES for h in body["hosts"])
            token = body["next_page_token"]
            if not token:
                break
        assert listed == host_ids
        assert len(first_page) < HOSTS

        with api.stream("GET", "/api/hosts/events", params={"page_size": 500}) as stream:
            events = sse_events(stream)
            scope = next(data for name, data in events if name == "scope")
        assert json.loads(scope) == {"last_key": first_page[-1]}

    with httpx.Client(base_url=base, timeout=60) as person:
        assert log_in(person, "/fleet").status_code == 303
        fleet = person.get("/fleet")
        assert fleet.status_code == 200, fleet.text[:300]
        shown = re.findall(r'id="host-([^"]+)"', fleet.text)
        assert shown and shown == host_ids[: len(shown)]
