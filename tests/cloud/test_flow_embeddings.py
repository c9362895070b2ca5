"""Retrieval with the OpenAI embeddings API (the real SDK against the fake server's
/v1/embeddings), its fallback to the lexical scorer, and the pgvector check — on both backends.

The test PostgreSQL here has no `vector` extension (Debian 12 ships no pgvector package for it,
and nothing else may be downloaded): `_has_pgvector` says so, and the SQL ranking path is not
exercised (docs/benchmarks.md, "Learned flows", says what is untested)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.flows.embeddings import OpenAIEmbedder
from cloud.flows.retrieval import Retriever
from cloud.server import build_server
from cloud.settings import CloudSettings, SettingError
from cloud.store import flows
from cloud.store.database import Store
from planner.flows.synthesis import synthesize
from planner.settings import PlannerSettings
from tests.support.fakes import OPENAI_KEY, FakeModelServer
from tests.support.flows import dark_theme_steps


def _settings(db_url: str, **values: object) -> CloudSettings:
    return CloudSettings(database_url=db_url, flow_scorer="openai", **values)  # type: ignore[arg-type]


async def test_goals_are_ranked_by_openai_embeddings_and_fall_back_to_lexical(
    store: Store, db_url: str
) -> None:
    with FakeModelServer(openai_key=OPENAI_KEY) as fake:
        planner = PlannerSettings(
            openai_api_key=OPENAI_KEY,
            openai_base_url=fake.openai_base_url,
            provider="offline",
        )
        embedder = OpenAIEmbedder(planner, "text-embedding-3-small")
        try:
            made = {}
            for goal in ("Turn on dark theme", "Turn off dark theme"):
                synthesis = synthesize(goal, dark_theme_steps())
                assert synthesis.flow is not None
                (vector,) = await embedder.embed([synthesis.flow.embedding_text]) or []
                row, _ = await flows.add(
                    store,
                    synthesis.flow,
                    synthesis.fingerprint,
                    "t-src",
                    1,
                    embedding=vector,
                    embedding_model=embedder.model,
                )
                made[goal] = row
            retriever = Retriever(store, _settings(db_url), embedder)
            assert not await retriever._has_pgvector()
            ranked = await retriever.rank("Turn on dark theme", await flows.active(store))
            best = ranked[0]
            assert best.row.flow_id == made["Turn on dark theme"].flow_id
            assert best.scorer == "openai-embedding" and best.scored.score > 0.5
            opposite = next(
                r for r in ranked if r.row.flow_id == made["Turn off dark theme"].flow_id
            )
            assert not opposite.scored.usable  # however close the vectors, the goal is opposite
            # the SDK's own request: base64 floats, the model, the key
            body = fake.bodies("/embeddings")[-1]
            assert body["model"] == "text-embedding-3-small"
            assert body["encoding_format"] == "base64"
            assert fake.requests[-1].headers["authorization"] == f"Bearer {OPENAI_KEY}"

            fake.go_down(503)
            ranked = await retriever.rank("Turn on dark theme", await flows.active(store))
            assert ranked[0].scorer == "lexical" and ranked[0].scored.score == 1.0
        finally:
            await embedder.aclose()


async def test_openai_scoring_without_a_key_is_refused_at_start(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AMC_PLANNER_OPENAI_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SettingError) as err:
        await build_server(_settings(db_url, insecure=True, listen_address="127.0.0.1:0"))
    assert err.value.setting == "AMC_CLOUD_FLOW_SCORER"
