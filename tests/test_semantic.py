"""Retrieval by meaning (spec 002): stamped vectors, backfill, hybrid, and the keyword fallback."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from fakes import FakeOllama, HashEmbedder

from memshelf import DimensionMismatch, EmbedderUnavailable, Owner
from memshelf.embedders.ollama import OllamaEmbedder

KALEB = Owner("home", "kaleb")
MAYA = Owner("home", "maya")
PAPER_QUESTION = "what is the thing in the hall that eats paper"


def contents(hits):
    return [h.memory.content for h in hits]


def stored_models(shelf, owner):
    return [r["embed_model"] for r in shelf.export(owner) if r["kind"] == "memory"]


@pytest.mark.slow
def test_spec_example_with_the_real_model(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    shelf.remember(KALEB, "home", "The morning routine starts the coffee maker at 07:00.")
    hits = shelf.search(KALEB, PAPER_QUESTION, mode="semantic", limit=5)
    assert contents(hits)[0] == "The printer jams on thick paper."
    assert "The morning routine starts the coffee maker at 07:00." not in contents(hits)  # cut by the floor
    assert all(h.retriever == "semantic" and h.score >= shelf.floor for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    block = shelf.context(KALEB, PAPER_QUESTION, mode="semantic")
    assert block.splitlines()[1] == "  - [0.6] The printer jams on thick paper."


@pytest.mark.slow
def test_hybrid_finds_by_meaning_what_keywords_miss(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    shelf.remember(KALEB, "home", "The morning routine starts the coffee maker at 07:00.")
    assert list(shelf.search(KALEB, "hall device eating sheets", mode="keyword")) == []
    hybrid = shelf.search(KALEB, "which machine keeps chewing the sheets I feed it", mode="auto")
    assert hybrid.mode == "hybrid"
    assert contents(hybrid)[:1] == ["The printer jams on thick paper."]


@pytest.mark.slow
def test_spec_000_examples_hold_with_the_real_model_on(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.remember(KALEB, "network", "The printer might be on the guest network.", source="inferred")
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    assert shelf.context(KALEB, "What did I say the printer's address was?").splitlines()[1:] == [
        "  - [1.0] The office printer is on 192.168.1.40.",
        "  - [0.6] The printer jams on thick paper.",
        "  - [0.4] The printer might be on the guest network.",
    ]
    assert shelf.context(KALEB, "How was your day?") == ""


def test_remember_stamps_vectors_with_the_model(open_shelf):
    embedder = HashEmbedder("test:a")
    shelf = open_shelf(embedder=embedder)
    shelf.remember_many(KALEB, [{"topic": "t", "content": f"statement {i}"} for i in range(5)])
    assert stored_models(shelf, KALEB) == ["test:a"] * 5
    assert embedder.calls == [5]  # one batch for the whole call


def test_another_models_vectors_are_never_compared_until_backfill(open_shelf):
    old = open_shelf(embedder=HashEmbedder("test:a"))
    old.remember(KALEB, "network", "The printer jams on thick paper.")
    new = open_shelf(embedder=HashEmbedder("test:b", dims=32))
    assert list(new.search(KALEB, "printer paper", mode="semantic")) == []
    assert new.backfill() == 1
    assert stored_models(new, KALEB) == ["test:b"]
    assert contents(new.search(KALEB, "printer paper", mode="semantic")) == ["The printer jams on thick paper."]
    assert new.backfill() == 0  # nothing stale left


class FlakyEmbedder(HashEmbedder):
    """Fails on the n-th batch, like a service that dies half way through a backfill."""

    def __init__(self, fail_on_batch: int) -> None:
        super().__init__("test:b")
        self.fail_on_batch = fail_on_batch

    def embed_batch(self, texts):
        if len(self.calls) + 1 == self.fail_on_batch:
            self.calls.append(-1)
            raise EmbedderUnavailable("connection refused")
        return super().embed_batch(texts)


def test_backfill_resumes_after_an_interruption(open_shelf):
    keyword_only = open_shelf(embedder=None)
    keyword_only.remember_many(KALEB, [{"topic": "t", "content": f"statement {i}"} for i in range(25)])
    flaky = open_shelf(embedder=FlakyEmbedder(fail_on_batch=3))
    progress = []
    with pytest.raises(EmbedderUnavailable):
        flaky.backfill(batch_size=10, progress=lambda done, total: progress.append((done, total)))
    assert progress == [(10, 25), (20, 25)]
    assert stored_models(flaky, KALEB).count("test:b") == 20
    resumed = open_shelf(embedder=HashEmbedder("test:b"))
    assert resumed.backfill(batch_size=10) == 5
    assert stored_models(resumed, KALEB) == ["test:b"] * 25


def test_embedder_outage_keeps_writes_and_degrades_search(open_shelf, caplog):
    with FakeOllama() as server:
        shelf = open_shelf(embedder=OllamaEmbedder(host=server.url, timeout=2))
        shelf.remember(KALEB, "network", "The printer jams on thick paper.")
        server.stop()
        with caplog.at_level(logging.WARNING, logger="memshelf"):
            shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
            result = shelf.search(KALEB, "printer")
        assert stored_models(shelf, KALEB) == ["ollama:nomic-embed-text", None]  # stored, waiting for backfill
        assert result.degraded and result.mode == "keyword" and server.url in result.reason
        assert set(contents(result)) == {"The printer jams on thick paper.", "The office printer is on 192.168.1.40."}
        assert sum("keyword" in r.message for r in caplog.records) == 1
        assert shelf.context(KALEB, "printer address").startswith("Relevant knowledge")
        assert "Memory context" not in shelf.build_prompt("base", KALEB, "printer")


def test_backfill_picks_up_what_the_outage_missed(open_shelf):
    server = FakeOllama().start()
    shelf = open_shelf(embedder=OllamaEmbedder(host=server.url, timeout=2))
    server.stop()
    shelf.remember(KALEB, "network", "The printer jams on thick paper.")
    with FakeOllama() as again:
        revived = open_shelf(embedder=OllamaEmbedder(host=again.url, timeout=2))
        assert revived.backfill() == 1
        assert contents(revived.search(KALEB, "printer paper", mode="semantic")) == ["The printer jams on thick paper."]


def test_semantic_search_never_crosses_owners(open_shelf):
    shelf = open_shelf(embedder=HashEmbedder())
    shelf.remember(MAYA, "network", "The printer jams on thick paper.")
    shelf.remember(Owner("other", "kaleb"), "network", "The printer jams on thick paper.")
    shelf.remember(KALEB, "garden", "Tomatoes need water daily.")
    for mode in ("semantic", "hybrid"):
        assert contents(shelf.search(KALEB, "The printer jams on thick paper.", mode=mode, floor=-1.0)) == [
            "Tomatoes need water daily."]


def test_wrong_length_vector_names_both_models(open_shelf):
    shelf = open_shelf(embedder=HashEmbedder("test:a", dims=64))
    with pytest.raises(DimensionMismatch, match=r"32 dimensions.*test:a makes 64-d"):
        shelf.remember_many(KALEB, [{"topic": "t", "content": "x", "vector": np.ones(32).tolist()}])
    assert stored_models(shelf, KALEB) == []


def test_precomputed_vectors_are_stored_as_given(open_shelf):
    embedder = HashEmbedder("test:a", dims=8)
    shelf = open_shelf(embedder=embedder)
    shelf.remember_many(KALEB, [{"topic": "t", "content": "given", "vector": [1, 0, 0, 0, 0, 0, 0, 0]}])
    assert embedder.calls == []
    hits = shelf.search(KALEB, "anything", mode="semantic", floor=-1.0)
    assert contents(hits) == ["given"]


def test_a_model_that_changes_size_under_one_name_is_a_clear_error(open_shelf):
    open_shelf(embedder=HashEmbedder("test:same", dims=16)).remember(KALEB, "t", "one")
    shelf = open_shelf(embedder=HashEmbedder("test:same", dims=24))
    with pytest.raises(DimensionMismatch, match="test:same"):
        shelf.search(KALEB, "one", mode="semantic")


def test_expired_memories_are_not_found_by_meaning(open_shelf, clock):
    shelf = open_shelf(embedder=HashEmbedder(), clock=clock)
    shelf.remember(KALEB, "guest", "The guest wifi password is tulip42.", ttl=5)
    assert len(shelf.search(KALEB, "guest wifi password", mode="semantic")) == 1
    clock.advance(5)
    assert list(shelf.search(KALEB, "guest wifi password", mode="semantic")) == []
    assert list(shelf.search(KALEB, "guest wifi password", mode="hybrid")) == []


def test_hybrid_hits_explain_themselves(open_shelf):
    shelf = open_shelf(embedder=HashEmbedder())
    shelf.remember(KALEB, "network", "The printer jams on thick paper.")
    hit = shelf.search(KALEB, "printer jams", mode="hybrid")[0]
    assert hit.retriever == "hybrid"
    assert {"keyword_rank", "keyword_score", "semantic_rank", "semantic_score"} <= set(hit.details)


def test_search_sees_memories_written_by_another_shelf_on_the_same_file(open_shelf):
    reader = open_shelf(embedder=HashEmbedder())
    writer = open_shelf(embedder=HashEmbedder())
    writer.remember(KALEB, "a", "first statement")
    assert len(reader.search(KALEB, "first statement", mode="semantic")) == 1
    writer.remember(KALEB, "a", "second statement")
    assert len(reader.search(KALEB, "second statement", mode="semantic", floor=0.9)) == 1


def test_import_embeds_in_batches_what_has_no_vector_of_the_current_model(open_shelf):
    plain = open_shelf(embedder=None)
    plain.remember_many(KALEB, [{"topic": "t", "content": f"statement {i}"} for i in range(70)])
    records = list(plain.export(KALEB))
    embedder = HashEmbedder("test:a")
    shelf = open_shelf(embedder=embedder)
    shelf.import_(MAYA, records)
    assert embedder.calls == [64, 6]
    assert stored_models(shelf, MAYA) == ["test:a"] * 70
    again = list(shelf.export(MAYA))
    embedder.calls.clear()
    shelf.import_(Owner("x", "y"), again)  # already stamped with the current model: kept, not re-embedded
    assert embedder.calls == []
    assert list(shelf.export(Owner("x", "y")))[1:] == again[1:]


def test_cached_vectors_follow_appends_deletes_and_expiry_changes(open_shelf, clock):
    shelf = open_shelf(embedder=HashEmbedder(), clock=clock)
    writer = open_shelf(embedder=HashEmbedder(), clock=clock)  # another connection, like another process
    first = shelf.remember(KALEB, "t", "alpha statement zero")
    assert contents(shelf.search(KALEB, "alpha statement zero", mode="semantic", limit=1)) == ["alpha statement zero"]
    writer.remember_many(KALEB, [{"topic": "t", "content": f"beta line {i}"} for i in range(150)])  # past capacity
    assert "beta line 149" in contents(shelf.search(KALEB, "beta line 149", mode="semantic", limit=10))
    writer.forget(KALEB, first.id)
    assert "alpha statement zero" not in contents(shelf.search(KALEB, "alpha statement zero", mode="semantic"))
    writer.remember(KALEB, "t", "gamma note", ttl=10)
    assert contents(shelf.search(KALEB, "gamma note", mode="semantic", limit=1)) == ["gamma note"]
    writer.remember(KALEB, "t", "gamma note", ttl=1000)  # a repeat that extends the expiry
    clock.advance(10)
    assert contents(shelf.search(KALEB, "gamma note", mode="semantic", limit=1)) == ["gamma note"]
    clock.advance(1000)
    assert "gamma note" not in contents(shelf.search(KALEB, "gamma note", mode="semantic", limit=3))
    assert len(shelf.search(KALEB, "beta line", mode="semantic", limit=1000, floor=-1.0)) == 150


@pytest.mark.slow
def test_spec_002_build_prompt_by_meaning(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    shelf.remember(KALEB, "home", "The morning routine starts the coffee maker at 07:00.")
    assert shelf.build_prompt("You are GLaDOS. Be sardonic and brief.", KALEB, PAPER_QUESTION, mode="semantic") == (
        "You are GLaDOS. Be sardonic and brief.\n"
        "\n"
        "Memory context:\n"
        "Known facts about the user:\n"
        "  - user_name: Kaleb\n"
        "\n"
        "Relevant knowledge (confidence in brackets, 1.0 means the user said so):\n"
        "  - [0.6] The printer jams on thick paper.\n"
        "  - [1.0] The office printer is on 192.168.1.40."
    )


def test_a_split_scan_scores_exactly_like_a_single_one():
    from memshelf._vectors import PARALLEL_ROWS, _cosines, normalize

    rng = np.random.default_rng(3)
    matrix = normalize(rng.standard_normal((PARALLEL_ROWS + 1001, 32)).astype(np.float32))
    query = normalize(rng.standard_normal(32).astype(np.float32))
    assert np.allclose(_cosines(matrix, query), matrix @ query, atol=1e-6)
    assert np.allclose(_cosines(matrix[:100], query), matrix[:100] @ query, atol=1e-6)
