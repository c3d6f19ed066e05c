"""Long memories embedded in overlapping pieces (README, "Long memories"): how texts are cut, search by meaning
scoring a memory by its best piece, and the pieces following their memory through every write, erasure, re-embedding
and copy, on both backends. The bag-of-words HashEmbedder (with a small window) makes the storage tests fast and
exact; the real model shows the point of it all."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from fakes import HashEmbedder
from test_tables import _rows

from memshelf import DimensionMismatch, Owner
from memshelf.embedders._pieces import OVERLAP, split_by_chars
from memshelf.migrate import migrate
from memshelf._vectors import VectorMatrix, pack, top_k

KALEB = Owner("home", "kaleb")
MAYA = Owner("home", "maya")
FILLER = ("We spent the morning walking along the coast, stopping at every small harbour to watch the fishing boats "
          "come in, and talked about the weather, the tides and which café served the best pastries. ")
NEEDLE = "My passport is in the blue folder under the bed."
LONG = FILLER * 12 + NEEDLE
"""About 2,400 characters (500 word pieces) whose only sentence about the passport is the last."""
QUESTION = "Where did I put my passport?"
WORDS = "passport blue folder bed"
"""What the bag-of-words embedder needs to match the last sentence (it knows no meaning)."""


def pieced(window: int = 200, model: str = "test:hash-64") -> HashEmbedder:
    return HashEmbedder(model, window_chars=window)


def piece_rows(backend: str, target: str, owner: Owner | None = None) -> list[tuple[str, int]]:
    """(model, piece number) of every stored piece row, read straight from the database."""
    where, params = ("", ()) if owner is None else (" WHERE tenant = ? AND user_id = ?", (owner.tenant, owner.user))
    return sorted(_rows(backend, target, f"SELECT embed_model, piece FROM memory_pieces{where}", params))


def found(shelf, owner, question, **options) -> list[str]:
    return [h.memory.content for h in shelf.search(owner, question, mode="semantic", **options)]


# ---------------------------------------------------------------- cutting
def test_character_pieces_cover_the_text_within_the_window_cut_between_words_and_overlapping():
    text = " ".join(f"word{i}" for i in range(400))  # every piece is found at one place
    pieces = split_by_chars(text, 300)
    starts = [text.index(p) for p in pieces]
    assert len(pieces) > 1 and all(len(p) <= 300 for p in pieces)
    assert starts[0] == 0 and text.endswith(pieces[-1])
    for start, before, after_start in zip(starts, pieces, starts[1:]):
        assert start < after_start < start + len(before)  # consecutive pieces overlap
        assert start + len(before) - after_start >= 300 * OVERLAP * 0.5  # by about a quarter of the window
        assert text[after_start - 1] == " " and before.endswith(" ")  # cut between words
    assert split_by_chars("short text", 300) == ["short text"]


@pytest.mark.slow
def test_the_local_model_cuts_by_its_own_word_pieces(local_embedder):
    from memshelf.embedders.local import WINDOW, _splitter_tokenizer

    long_pieces, short_pieces, korean = local_embedder.pieces([LONG, "I moved to Lisbon.", "한국어 문장 " * 150])
    tokens = [len(_splitter_tokenizer().encode(p, add_special_tokens=False).ids) for p in long_pieces]
    assert len(long_pieces) >= 2 and max(tokens) <= WINDOW
    assert tokens[0] > WINDOW - 10  # the first piece is what the model used to read of the whole text
    assert LONG.startswith(long_pieces[0]) and long_pieces[-1].endswith(NEEDLE)
    assert short_pieces == ["I moved to Lisbon."]
    assert len(korean) >= 2  # short in characters, long in word pieces


# ---------------------------------------------------------------- search by the best piece
@pytest.mark.slow
def test_a_long_memory_is_found_by_a_sentence_near_its_end(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    shelf.remember_many(KALEB, [{"topic": "trip", "content": LONG},
                                {"topic": "home", "content": "The spare keys hang by the front door."},
                                {"topic": "car", "content": "The car is parked on level two of the garage."}])
    whole = float(np.dot(local_embedder.embed(LONG), local_embedder.embed(QUESTION)))
    assert whole < shelf.floor  # one vector of the whole text: the model read the coast walk, never the passport
    hits = shelf.search(KALEB, QUESTION, mode="semantic", limit=1)
    assert [h.memory.content for h in hits] == [LONG]
    assert hits[0].score > whole + 0.1


def test_semantic_search_scores_a_memory_by_its_best_piece(open_shelf, backend, target):
    shelf = open_shelf(embedder=pieced())
    shelf.remember(KALEB, "trip", LONG)
    shelf.remember(KALEB, "home", "The spare keys hang by the front door.")
    hits = shelf.search(KALEB, WORDS, mode="semantic", limit=5)
    assert [h.memory.content for h in hits] == [LONG]  # once, however many pieces matched
    first = HashEmbedder().embed(LONG[:200]) @ HashEmbedder().embed(WORDS)
    assert first + 0.1 < hits[0].score  # the best piece, not the first (the memory's own vector)
    assert len(piece_rows(backend, target)) == len(pieced().pieces([LONG])[0]) - 1


def test_short_memories_store_no_piece_rows(open_shelf, backend, target):
    embedder = pieced()
    shelf = open_shelf(embedder=embedder)
    shelf.remember_many(KALEB, [{"topic": "t", "content": f"short statement number {i}"} for i in range(20)])
    assert piece_rows(backend, target) == []
    assert embedder.calls == [20]  # one vector each, in one batch


def test_pieces_go_with_forget_erasure_and_purge(open_shelf, clock, backend, target):
    shelf = open_shelf(embedder=pieced(), clock=clock)
    gone = shelf.remember(KALEB, "trip", LONG)
    shelf.remember(KALEB, "later", LONG + " Second copy.", ttl=60)
    shelf.remember(MAYA, "trip", LONG + " Maya's copy.")
    per_memory = len(pieced().pieces([LONG])[0]) - 1
    assert len(piece_rows(backend, target, KALEB)) == 2 * per_memory
    shelf.forget(KALEB, gone.id)
    assert len(piece_rows(backend, target, KALEB)) == per_memory
    clock.advance(61)
    assert found(shelf, KALEB, WORDS) == []  # expired: invisible to meaning from that instant, pieces and all
    shelf.purge_expired()
    assert piece_rows(backend, target, KALEB) == []
    assert len(piece_rows(backend, target, MAYA)) == per_memory
    shelf.forget_user(MAYA)
    assert piece_rows(backend, target) == []
    shelf.remember(Owner("gone", "x"), "trip", LONG)
    shelf.forget_tenant("gone")
    assert piece_rows(backend, target) == []


def test_a_superseded_long_memory_drops_out_of_vector_search(open_shelf, clock, backend, target):
    shelf = open_shelf(embedder=pieced(), clock=clock)
    old = shelf.remember(KALEB, "trip", LONG)
    clock.advance(1)
    new = shelf.remember(KALEB, "trip", "The passport went to the embassy for a visa.")
    assert shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    assert LONG not in found(shelf, KALEB, WORDS)
    assert LONG in found(shelf, KALEB, WORDS, include_superseded=True)  # the past still sees it, by its pieces
    assert LONG in found(shelf, KALEB, WORDS, as_of=old.created_at)


def test_backfill_embeds_pieces_and_a_model_change_never_mixes_stamps(open_shelf, backend, target):
    open_shelf(embedder=None).remember(KALEB, "trip", LONG)
    first = open_shelf(embedder=pieced(model="test:a"))
    assert first.backfill() == 1
    assert {m for m, _ in piece_rows(backend, target)} == {"test:a"} and found(first, KALEB, WORDS) == [LONG]
    second = open_shelf(embedder=pieced(window=400, model="test:b"))
    assert found(second, KALEB, WORDS) == []  # test:a's rows and pieces are never compared with test:b's question
    assert second.backfill() == 1
    rows = piece_rows(backend, target)
    assert {m for m, _ in rows} == {"test:b"} and len(rows) == len(pieced(window=400).pieces([LONG])[0]) - 1
    assert found(second, KALEB, WORDS) == [LONG] and found(first, KALEB, WORDS) == []


def test_observing_a_long_memory_again_with_another_model_replaces_its_pieces(open_shelf, backend, target):
    open_shelf(embedder=pieced(model="test:a")).remember(KALEB, "trip", LONG)
    shelf = open_shelf(embedder=pieced(window=400, model="test:b"))
    assert shelf.remember(KALEB, "trip", LONG).observations == 2
    assert {m for m, _ in piece_rows(backend, target)} == {"test:b"}
    assert found(shelf, KALEB, WORDS) == [LONG]


def test_a_wrong_length_vector_is_still_refused_for_a_long_memory(open_shelf, backend, target):
    shelf = open_shelf(embedder=pieced())
    shelf.remember(KALEB, "trip", "A short one first.")
    with pytest.raises(DimensionMismatch, match="63 dimensions"):
        shelf.remember_many(KALEB, [{"topic": "trip", "content": LONG},
                                    {"topic": "x", "content": "given", "vector": [0.1] * 63}])
    assert piece_rows(backend, target) == [] and found(shelf, KALEB, WORDS) == []


# ---------------------------------------------------------------- copies
def test_import_embeds_a_long_memory_again_in_pieces(open_shelf, backend, target):
    shelf = open_shelf(embedder=pieced())
    shelf.remember(KALEB, "trip", LONG)
    records = list(shelf.export(KALEB))
    assert [r["content"] for r in records if r["kind"] == "memory"] == [LONG]  # one vector each: pieces stay home
    counts = shelf.import_(MAYA, records)
    assert counts["memories"] == 1
    assert piece_rows(backend, target, MAYA) == piece_rows(backend, target, KALEB) != []
    assert found(shelf, MAYA, WORDS) == [LONG]


def test_migrate_carries_the_pieces_from_sqlite_to_postgresql(tmp_path, pg_fresh_url):
    from memshelf import Shelf

    source = str(tmp_path / "source.db")
    with Shelf.open(source, embedder=pieced()) as shelf:
        shelf.remember(KALEB, "trip", LONG)
        shelf.remember(KALEB, "home", "The spare keys hang by the front door.")
    assert migrate(source, pg_fresh_url).owners == 1
    assert piece_rows("postgres", pg_fresh_url) == piece_rows("sqlite", source) != []
    with Shelf.open(pg_fresh_url, embedder=pieced()) as shelf:
        assert found(shelf, KALEB, WORDS) == [LONG]


# ---------------------------------------------------------------- the in-process matrix
def test_the_matrix_scores_each_key_once_by_its_best_row():
    rows = [(1, pack([1.0, 0.0]), 1.0, None), (2, pack([0.0, 1.0]), 1.0, None), (2, pack([0.9, 0.1]), 1.0, None),
            (3, pack([0.5, 0.5]), 0.4, None)]
    matrix = VectorMatrix.build("m", rows[:2], lambda _: None).extended(rows[2:], lambda _: None)
    assert matrix.repeats == 1
    picks = top_k(matrix, np.array([1.0, 0.0], np.float32), 3, 0.0, 0.0)
    assert [int(matrix.keys[i]) for i, _ in picks] == [1, 2, 3]
    assert picks[1][1] == pytest.approx(0.9 / np.hypot(0.9, 0.1), abs=1e-6)
    assert [int(matrix.keys[i]) for i, _ in top_k(matrix, np.array([1.0, 0.0], np.float32), 1, 0.0, 0.0)] == [1]


def test_expiry_of_a_row_hides_its_pieces(open_shelf, clock):
    shelf = open_shelf(embedder=pieced(), clock=clock)
    shelf.remember(KALEB, "trip", LONG, ttl=timedelta(seconds=30))
    assert found(shelf, KALEB, WORDS) == [LONG]
    clock.advance(31)
    assert found(shelf, KALEB, WORDS) == []


# ---------------------------------------------------------------- service embedders' windows
def test_service_embedders_cut_by_characters_from_their_models_window(monkeypatch):
    from memshelf import ConfigError
    from memshelf.embedders.ollama import OllamaEmbedder
    from memshelf.embedders.openai import OpenAIEmbedder

    monkeypatch.delenv("MEMSHELF_EMBED_WINDOW_TOKENS", raising=False)
    assert OllamaEmbedder("mxbai-embed-large:latest").window_chars == 1_024  # 512 tokens, 2 characters each
    assert OllamaEmbedder("some-new-model").window_chars == 1_024  # unknown: the smallest common window
    assert OpenAIEmbedder("text-embedding-3-small").window_chars == 16_382  # a whole 16,000-character memory
    assert OllamaEmbedder("mxbai-embed-large", window_tokens=100).pieces([LONG])[0] == split_by_chars(LONG, 200)
    monkeypatch.setenv("MEMSHELF_EMBED_WINDOW_TOKENS", "256")
    assert OpenAIEmbedder("text-embedding-3-small").window_chars == 512
    monkeypatch.setenv("MEMSHELF_EMBED_WINDOW_TOKENS", "lots")
    with pytest.raises(ConfigError, match="MEMSHELF_EMBED_WINDOW_TOKENS.*'lots'"):
        OllamaEmbedder()
