"""Behaviour every backend must show: the contract suite. memshelf runs it on SQLite and PostgreSQL
(tests/test_contract.py); a third backend runs it with `from memshelf.testing.contract import *` and one fixture,
`memshelf_target` (see memshelf.testing).
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, UTC

import pytest

from ..errors import ConfigError, Conflict, InvalidInput, NotFound, UnknownSource
from ..model import MAX_CONTENT_CHARS, Owner, UserSummary
from ..stores.base import Evidence, Mark
from . import clock, open_shelf, shelf


KALEB = Owner("home", "kaleb")
MAYA = Owner("acme", "maya")
SAME_USER_OTHER_TENANT = Owner("other", "kaleb")
SAME_TENANT_OTHER_USER = Owner("home", "maya")
STRANGERS = [SAME_USER_OTHER_TENANT, SAME_TENANT_OTHER_USER]


def contents(hits):
    return [h.memory.content for h in hits]


def count_memories(shelf, owner):
    return sum(1 for r in shelf.export(owner) if r["kind"] == "memory")


# ---------------------------------------------------------------- ownership
def test_other_owners_get_nothing(shelf):
    memory = shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    shelf.log_message(KALEB, "t1", "user", "where is the printer?")
    for stranger in STRANGERS:
        assert list(shelf.search(stranger, "printer")) == []
        assert shelf.context(stranger, "printer address") == ""
        assert shelf.facts(stranger) == []
        assert shelf.messages(stranger, "t1") == []
        assert [r["kind"] for r in shelf.export(stranger)] == ["memshelf-export"]
        with pytest.raises(NotFound):
            shelf.get(stranger, memory.id)
    assert contents(shelf.search(KALEB, "printer")) == ["The office printer is on 192.168.1.40."]


def test_forget_with_another_owners_id_is_not_found_and_deletes_nothing(shelf):
    memory = shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    for stranger in STRANGERS:
        with pytest.raises(NotFound):
            shelf.forget(stranger, memory.id)
    assert shelf.get(KALEB, memory.id).content == memory.content


def test_forget_user_leaves_other_owners_alone(shelf):
    shelf.remember(KALEB, "network", "Kaleb's printer is on 192.168.1.40.")
    shelf.remember(SAME_TENANT_OTHER_USER, "network", "Maya's printer is on 10.0.0.9.")
    shelf.remember(SAME_USER_OTHER_TENANT, "network", "Other Kaleb's printer is in the attic.")
    erased = shelf.forget_user(KALEB)
    assert erased.memories == 1
    assert list(shelf.search(KALEB, "printer")) == []
    assert contents(shelf.search(SAME_TENANT_OTHER_USER, "printer")) == ["Maya's printer is on 10.0.0.9."]
    assert contents(shelf.search(SAME_USER_OTHER_TENANT, "printer")) == ["Other Kaleb's printer is in the attic."]


def test_same_id_in_two_owners_is_two_records(shelf):
    """Import keeps ids; the same id under two owners must never collide or cross."""
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    records = list(shelf.export(KALEB))
    shelf.import_(MAYA, records)
    memory_id = records[1]["id"]
    shelf.forget(MAYA, memory_id)
    assert shelf.get(KALEB, memory_id).content == "The office printer is on 192.168.1.40."
    with pytest.raises(NotFound):
        shelf.get(MAYA, memory_id)


# ---------------------------------------------------------------- sources
def test_builtin_source_confidences(shelf):
    got = {s: shelf.remember(KALEB, "t", f"from {s}", source=s).confidence for s in ("stated", "mined", "inferred")}
    assert got == {"stated": 1.0, "mined": 0.6, "inferred": 0.4}


def test_declared_source(open_shelf):
    shelf = open_shelf(sources={"sensor": 0.8})
    assert shelf.remember(KALEB, "climate", "The hall is 19 degrees.", source="sensor").confidence == 0.8


def test_unknown_source_is_an_error_before_anything_is_written(shelf):
    with pytest.raises(UnknownSource, match="declare a new source first"):
        shelf.remember(KALEB, "climate", "The hall is 19 degrees.", source="sensor")
    with pytest.raises(UnknownSource):
        shelf.remember_many(KALEB, [{"topic": "a", "content": "valid line"},
                                    {"topic": "a", "content": "bad source", "source": "gossip"}])
    assert count_memories(shelf, KALEB) == 0


@pytest.mark.parametrize("worth", [0, -1, 1.5, "high", True])
def test_declared_source_needs_a_sane_worth(open_shelf, worth):
    with pytest.raises(InvalidInput):
        open_shelf(sources={"sensor": worth})


# ---------------------------------------------------------------- dedup
def test_identical_memory_is_stored_once_and_counted(shelf, clock):
    first = shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    clock.advance(60)
    again = shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    assert again.id == first.id
    assert again.observations == 2
    assert again.last_seen == first.created_at + timedelta(seconds=60)
    assert again.created_at == first.created_at
    assert count_memories(shelf, KALEB) == 1


def test_repeat_from_a_better_source_raises_confidence(shelf):
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="inferred")
    again = shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="stated")
    assert (again.source, again.confidence) == ("stated", 1.0)
    weaker = shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    assert (weaker.source, weaker.confidence, weaker.observations) == ("stated", 1.0, 3)


def test_same_text_under_another_topic_is_another_memory(shelf):
    a = shelf.remember(KALEB, "network", "It jams.")
    b = shelf.remember(KALEB, "printer", "It jams.")
    assert a.id != b.id


# ---------------------------------------------------------------- expiry
def test_expired_memory_is_invisible_from_that_instant(shelf, clock):
    memory = shelf.remember(KALEB, "guest", "The guest wifi password is tulip42.", ttl=60)
    assert memory.expires_at == clock.now + timedelta(seconds=60)
    clock.advance(59.999)
    assert contents(shelf.search(KALEB, "wifi password")) == ["The guest wifi password is tulip42."]
    clock.advance(0.001)
    assert list(shelf.search(KALEB, "wifi password")) == []
    assert shelf.context(KALEB, "wifi password") == ""
    with pytest.raises(NotFound):
        shelf.get(KALEB, memory.id)
    assert shelf.list_memories(KALEB)[0] == []


def test_purge_deletes_expired_for_good(shelf, clock):
    shelf.remember(KALEB, "guest", "The guest wifi password is tulip42.",
                   expires_at=clock.now + timedelta(hours=1))
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.log_message(KALEB, "t1", "user", "temporary chatter", ttl=10)
    clock.advance(3600)
    erased = shelf.purge_expired()
    assert (erased.memories, erased.messages) == (1, 1)
    assert [r["content"] for r in shelf.export(KALEB) if r["kind"] == "memory"] == [
        "The office printer is on 192.168.1.40."]


def test_expiry_needs_an_aware_datetime_or_positive_ttl(shelf):
    with pytest.raises(InvalidInput, match="naive"):
        shelf.remember(KALEB, "t", "x", expires_at=datetime(2030, 1, 1))
    for ttl in (0, -5, float("nan"), "soon", True, 4e-7, timedelta(microseconds=0.4)):
        with pytest.raises(InvalidInput):  # under a microsecond it would expire as it is made
            shelf.remember(KALEB, "t", "x", ttl=ttl)
    with pytest.raises(InvalidInput, match="not both"):
        shelf.remember(KALEB, "t", "x", ttl=5, expires_at=datetime(2030, 1, 1, tzinfo=UTC))
    assert count_memories(shelf, KALEB) == 0


def test_observing_an_expired_memory_again_revives_it(shelf, clock):
    shelf.remember(KALEB, "guest", "The guest wifi password is tulip42.", ttl=10)
    clock.advance(20)
    again = shelf.remember(KALEB, "guest", "The guest wifi password is tulip42.")
    assert again.expires_at is None
    assert contents(shelf.search(KALEB, "wifi")) == ["The guest wifi password is tulip42."]


def test_an_expired_statement_repeated_by_a_guess_comes_back_as_a_guess(shelf, clock):
    """An expired memory is gone for every read, so a repeat revives it with the repeat's provenance: a guess of
    what the user once said is a guess, not a statement (before, it came back stated and never expiring)."""
    said = shelf.remember(KALEB, "guest", "The guest wifi password is tulip42.", "mined", ttl=10)
    assert shelf.confirm(KALEB, said.id).confirmed_at is not None  # the user vouched: stated
    clock.advance(20)
    guessed = shelf.remember(KALEB, "guest", "The guest wifi password is tulip42.", "inferred", ttl=60)
    later = shelf.now() + timedelta(seconds=60)
    assert (guessed.id, guessed.source, guessed.expires_at) == (said.id, "inferred", later)
    assert (guessed.confidence, guessed.confirmed_at) == (shelf.sources["inferred"], None)
    assert [h.memory.source for h in shelf.search(KALEB, "wifi")] == ["inferred"]


# ---------------------------------------------------------------- keyword search
def test_prefix_matching_finds_longer_words(shelf):
    shelf.remember(KALEB, "office", "Both printers are out of toner.")
    assert contents(shelf.search(KALEB, "printer")) == ["Both printers are out of toner."]


def test_a_short_word_ending_in_s_finds_its_own_word_not_every_word_its_stem_begins(shelf):
    """The stemmers cut the "s" of `aws`, `sms`, `bus` before matching: as prefixes, `aw`, `sm` and `bu` found
    "away", "small" and "but"."""
    aws, sms, bus, cats = ("Our AWS account id is 1234-5678.", "Send an SMS to the plumber.",
                           "The bus leaves at nine.", "My cats sleep all day.")
    others = ["The award went to Ana, who was away.", "A small favour for Ben.", "But we will buy a car.",
              "The category list is long."]
    for content in (aws, sms, bus, cats, *others):
        shelf.remember(KALEB, "notes", content)
    assert contents(shelf.search(KALEB, "aws", mode="keyword")) == [aws]
    assert contents(shelf.search(KALEB, "What is my AWS account?", mode="keyword")) == [aws]
    assert contents(shelf.search(KALEB, "sms", mode="keyword")) == [sms]
    assert contents(shelf.search(KALEB, "When does the bus leave?", mode="keyword")) == [bus]
    assert contents(shelf.search(KALEB, "ｂｕｓ", mode="keyword")) == [bus]  # full-width, as the index folds it
    assert contents(shelf.search(KALEB, "ＡＷＳ", mode="keyword")) == [aws]
    assert contents(shelf.search(KALEB, "cats", mode="keyword")) == [cats]
    assert sorted(contents(shelf.search(KALEB, "cat", mode="keyword"))) == sorted([cats, others[3]])  # a prefix


def test_non_ascii_words_are_found(shelf):
    shelf.remember(KALEB, "travel", "Kaleb lives in Zürich and likes the café on the corner.")
    assert len(shelf.search(KALEB, "Zürich")) == 1
    assert len(shelf.search(KALEB, "café")) == 1
    assert len(shelf.search(KALEB, "zurich")) == 1  # diacritics do not have to be typed


@pytest.mark.parametrize("stored, asked", [
    ("राहुल दिल्ली में रहता है।", "राहुल कहाँ रहता है?"),  # Devanagari: vowel signs are combining marks
    ("அவர் சென்னையில் வசிக்கிறார்.", "சென்னையில் யார்?"),  # Tamil: a virama ends the word
    ("שָׁלוֹם לְכֻלָּם", "שָׁלוֹם"),  # pointed Hebrew
    ("Kaleb lives in Zu\u0308rich.", "Zürich"),  # stored decomposed (NFD), asked composed
    ("Kaleb lives in Köln.", "Ko\u0308ln"),  # and the other way round
    ("\u05e9\u05c1\u05b4\u05dc\u05d5\u05b9\u05dd",) * 2,  # Hebrew marks typed in another order than NFC's
])
def test_words_written_with_combining_marks_are_found(shelf, stored, asked):
    shelf.remember(KALEB, "travel", stored)
    shelf.remember(KALEB, "travel", "Something else entirely.")
    assert contents(shelf.search(KALEB, asked, mode="keyword")) == [stored]


@pytest.mark.parametrize("stored, asked", [
    ("The ﬁnal ﬁle is on the shared drive.", "final file"),  # ligatures, as text copied from a PDF has them
    ("My ｉＰｈｏｎｅ is in the ＴＯＫＹＯ office.", "iphone tokyo"),  # full-width Latin letters
    ("Ο καφές είναι στο γραφείο.", "καφες γραφειο"),  # Greek accents do not have to be typed
    ("Ἀθῆναι in May.", "Αθήναι"),  # nor breathings
    ("The Straße is closed.", "strasse"),
    ("Łukasz flies from Łódź to København.", "lukasz lodz kobenhavn"),  # letters with a stroke
    ("Ærøskøbing ferry at nine.", "aeroskobing"),
    ("Встреча в субботу, ёлка в зале.", "елка"),
    ("Kaleb keeps the final file on his iPhone.", "ﬁnal ｉＰｈｏｎｅ"),  # and the other way round
])
def test_letters_are_found_folded_as_people_type_them(shelf, stored, asked):
    shelf.remember(KALEB, "travel", stored)
    shelf.remember(KALEB, "travel", "Something else entirely.")
    assert contents(shelf.search(KALEB, asked, mode="keyword")) == [stored]
    assert contents(shelf.search(KALEB, stored, mode="keyword"))[:1] == [stored]  # and as they were written


TOKYO = "東京の事務所は3階です"
SEOUL = "서울 사무실은 2층입니다"
BEIJING = "我们的AI项目在北京"


@pytest.mark.parametrize("question, found", [
    ("東京", [TOKYO]), ("事務所", [TOKYO]), ("東京の事務所は何階ですか", [TOKYO]), ("階", [TOKYO]),
    ("서울", [SEOUL]), ("사무실은 어디에 있어요?", [SEOUL]), ("北京", [BEIJING]), ("AI 项目", [BEIJING]),
    ("大阪", []), ("京都", []),
])
def test_chinese_japanese_and_korean_words_are_found_inside_runs(shelf, question, found):
    for content in (TOKYO, SEOUL, BEIJING):
        shelf.remember(KALEB, "office", content)
    assert contents(shelf.search(KALEB, question, mode="keyword")) == found


def test_two_letter_terms_are_found_and_two_letter_function_words_are_not(shelf):
    ai, ip = "The AI team ships the UI on Friday.", "My home IP is 10.0.0.5 and the services are written in Go."
    for content in (ai, ip, "It is up to me to check the goods."):
        shelf.remember(KALEB, "work", content)
    assert contents(shelf.search(KALEB, "Who builds the AI?")) == [ai]
    assert contents(shelf.search(KALEB, "what is my ip")) == [ip]
    assert contents(shelf.search(KALEB, "Is it up to me?")) == []  # function words only
    assert contents(shelf.search(KALEB, "Go")) == [ip]  # a whole word: never "goods"


def test_topic_is_searched_too(shelf):
    shelf.remember(KALEB, "printer", "It is on the second floor.")
    assert contents(shelf.search(KALEB, "printer")) == ["It is on the second floor."]


def test_equal_matches_come_back_newest_first(shelf, clock):
    shelf.remember(KALEB, "a", "The lamp is blue.")
    clock.advance(1)
    shelf.remember(KALEB, "a", "The lamp is green.")
    assert contents(shelf.search(KALEB, "lamp")) == ["The lamp is green.", "The lamp is blue."]


def test_confidence_outranks_match_quality(shelf):
    shelf.remember(KALEB, "a", "printer printer printer printer", source="mined")
    shelf.remember(KALEB, "a", "A long sentence that mentions the printer only once among many other words.")
    assert [h.memory.confidence for h in shelf.search(KALEB, "printer")] == [1.0, 0.6]


def test_more_matching_terms_rank_higher_within_a_confidence(shelf, clock):
    shelf.remember(KALEB, "a", "The printer address is 192.168.1.40.")
    clock.advance(1)
    shelf.remember(KALEB, "a", "The printer is beige.")
    assert contents(shelf.search(KALEB, "printer address"))[0] == "The printer address is 192.168.1.40."


@pytest.mark.parametrize("text", [
    'She said "hello" and left', "Robert'); DROP TABLE memories;--", "NEAR(printer toner) AND OR NOT",
    "wild* card^ col:umn {braces} (parens)", "emoji 🖨️ printer 🎉", "tab\tand\nnewline and \x07 bell",
])
def test_awkward_text_is_stored_and_searched_as_plain_text(shelf, text):
    memory = shelf.remember(KALEB, "awkward", text)
    assert shelf.get(KALEB, memory.id).content == text
    hits = shelf.search(KALEB, text)
    assert text in contents(hits)


@pytest.mark.parametrize("question", ['"', "*", "NEAR", "AND OR NOT", "'; --", "^col:"])
def test_fts_syntax_in_questions_never_errors(shelf, question):
    shelf.remember(KALEB, "a", "The printer is on.")
    assert isinstance(list(shelf.search(KALEB, question)), list)


def test_limit_is_respected_and_validated(shelf):
    shelf.remember_many(KALEB, [{"topic": "t", "content": f"printer note {i}"} for i in range(10)])
    assert len(shelf.search(KALEB, "printer", limit=3)) == 3
    for bad in (0, -1, 10**9, 2.5, "5"):
        with pytest.raises(InvalidInput):
            shelf.search(KALEB, "printer", limit=bad)


def test_semantic_mode_without_embedder_says_what_to_do(shelf):
    with pytest.raises(ConfigError, match="embedder"):
        shelf.search(KALEB, "printer", mode="semantic")
    with pytest.raises(InvalidInput, match="mode"):
        shelf.search(KALEB, "printer", mode="fuzzy")


def test_keyword_hits_say_how_they_were_found(shelf):
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    result = shelf.search(KALEB, "printer")
    assert result.mode == "keyword" and result.degraded is False
    assert [h.retriever for h in result] == ["keyword"]
    assert result[0].score > 0


def _hybrid_candidates(shelf, owner):
    found = shelf.store.keyword_search(owner, ["adoption", "meeting"], 5, shelf.now(), by_confidence=False)
    return [s.memory.content for s in found]


ADOPTION = "Caroline: I went to the adoption agency meeting yesterday."
ANSWER = "Melanie: How did it go? Was it a good meeting?"
ROOF = "Melanie: The meeting about the roof went badly."


def test_hybrid_candidates_are_ranked_with_the_conversation_around_them(shelf):
    adoption = shelf.remember(KALEB, "session_1", ADOPTION)
    shelf.remember(KALEB, "session_1", ANSWER)
    shelf.remember(KALEB, "session_2", ROOF)
    # Both mention "meeting" once; the answer was said right after the adoption agency came up.
    assert _hybrid_candidates(shelf, KALEB) == [ADOPTION, ANSWER, ROOF]
    assert ANSWER in contents(shelf.search(KALEB, "adoption meeting", mode="keyword"))  # by its own word
    shelf.import_(MAYA, shelf.export(KALEB))
    assert _hybrid_candidates(shelf, MAYA) == [ADOPTION, ANSWER, ROOF]  # imported memories get their context
    shelf.forget(KALEB, adoption.id)  # ... and lose the words of a forgotten neighbour
    assert _hybrid_candidates(shelf, KALEB) == [ROOF, ANSWER]


def test_purging_an_expired_memory_takes_its_words_out_of_its_neighbours_context(shelf, clock):
    shelf.remember(KALEB, "session_1", ADOPTION, ttl=60)
    shelf.remember(KALEB, "session_1", ANSWER)
    shelf.remember(KALEB, "session_2", ROOF)
    clock.advance(61)
    assert _hybrid_candidates(shelf, KALEB) == [ANSWER, ROOF]  # expired, but its words are still stored
    assert shelf.purge_expired().memories == 1
    assert _hybrid_candidates(shelf, KALEB) == [ROOF, ANSWER]


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("content", ["", "   ", "\n\t", "x" * (MAX_CONTENT_CHARS + 1), None, 42, b"bytes"])
def test_bad_content_is_refused_and_nothing_written(shelf, content):
    with pytest.raises(InvalidInput):
        shelf.remember(KALEB, "t", content)
    assert count_memories(shelf, KALEB) == 0


def test_content_at_the_limit_is_accepted(shelf):
    assert len(shelf.remember(KALEB, "t", "y" * MAX_CONTENT_CHARS).content) == MAX_CONTENT_CHARS


@pytest.mark.parametrize("topic", [None, 7, ["a"], "", "x" * 201])
def test_bad_topic_is_refused(shelf, topic):
    with pytest.raises(InvalidInput, match="topic"):
        shelf.remember(KALEB, topic, "content")


@pytest.mark.parametrize("tenant,user", [("", "kaleb"), ("home", ""), ("  ", "kaleb"), ("home", None),
                                         (None, "kaleb"), ("home\x00", "kaleb"), ("x" * 201, "kaleb")])
def test_owner_needs_tenant_and_user(tenant, user):
    with pytest.raises(InvalidInput):
        Owner(tenant, user)


def test_owner_must_be_an_owner(shelf):
    with pytest.raises(InvalidInput, match="Owner"):
        shelf.remember(("home", "kaleb"), "t", "x")


def test_a_bad_item_in_a_batch_writes_nothing(shelf):
    with pytest.raises(InvalidInput):
        shelf.remember_many(KALEB, [{"topic": "t", "content": "fine"}, {"topic": "t", "content": ""}])
    assert count_memories(shelf, KALEB) == 0


def test_empty_question_is_an_error_but_empty_user_text_gives_the_base_prompt(shelf):
    with pytest.raises(InvalidInput):
        shelf.search(KALEB, "  ")
    assert shelf.build_prompt("base", KALEB, "") == "base"


# ---------------------------------------------------------------- facts
def test_facts_upsert_and_keep_history(shelf, clock):
    shelf.set_fact(KALEB, "user_name", "Kal")
    clock.advance(1)
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    assert [(f.key, f.value) for f in shelf.facts(KALEB)] == [("user_name", "Kaleb")]
    assert [c.value for c in shelf.fact_history(KALEB, "user_name")] == ["Kal", "Kaleb"]


def test_facts_most_recent_first(shelf, clock):
    shelf.set_fact(KALEB, "a", "1")
    clock.advance(1)
    shelf.set_fact(KALEB, "b", "2")
    clock.advance(1)
    shelf.set_fact(KALEB, "a", "3")
    assert [f.key for f in shelf.facts(KALEB)] == ["a", "b"]


def test_facts_are_validated(shelf):
    with pytest.raises(InvalidInput):
        shelf.set_fact(KALEB, "", "x")
    with pytest.raises(InvalidInput):
        shelf.set_fact(KALEB, "k", "")
    with pytest.raises(UnknownSource):
        shelf.set_fact(KALEB, "k", "v", source="rumour")
    assert shelf.facts(KALEB) == []


def test_forget_fact(shelf):
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    shelf.forget_fact(KALEB, "user_name")
    assert shelf.facts(KALEB) == [] and shelf.fact_history(KALEB, "user_name") == []
    with pytest.raises(NotFound):
        shelf.forget_fact(KALEB, "user_name")


def test_prompt_budget_is_never_exceeded(open_shelf, clock):
    shelf = open_shelf(budget=200, clock=clock)
    for i in range(20):
        shelf.set_fact(KALEB, f"fact_{i:02d}", "v" * 20)
        clock.advance(1)
    shelf.remember(KALEB, "t", "The printer is on 192.168.1.40.")
    prompt = shelf.build_prompt("BASE", KALEB, "printer")
    assert len(prompt) - len("BASE") <= 200
    assert "  - fact_19: " in prompt  # the newest fact made it
    assert "fact_00" not in prompt


# ---------------------------------------------------------------- messages
def test_messages_are_history_not_knowledge(shelf):
    shelf.log_message(KALEB, "t1", "user", "My printer is called Gutenberg.")
    shelf.log_message(KALEB, "t1", "assistant", "Noted.")
    shelf.log_message(KALEB, "t2", "user", "Different thread.")
    assert [(m.role, m.content) for m in shelf.messages(KALEB, "t1")] == [
        ("user", "My printer is called Gutenberg."), ("assistant", "Noted.")]
    assert list(shelf.search(KALEB, "Gutenberg")) == []
    assert len(shelf.messages(KALEB)) == 3
    assert [m.content for m in shelf.messages(KALEB, "t1", limit=1)] == ["Noted."]


def test_a_conversation_is_logged_whole_or_not_at_all(shelf):
    said = [{"role": "user", "content": "I moved to Lisbon."}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "And my sister lives in Faro."}]
    logged = shelf.log_messages(KALEB, "t1", said)
    assert [{"role": m.role, "content": m.content} for m in logged] == said
    assert [{"role": m.role, "content": m.content} for m in shelf.messages(KALEB, "t1")] == said  # in order
    assert len({m.id for m in logged}) == 3
    for bad, problem in [([said[0], {"role": "user", "content": "  "}], "turn 2"),
                         ([said[0], {"role": "user", "content": "a\x00b"}], "turn 2"),
                         ([{"role": "user"}], "turn 1"), ([said[0], "Hello."], "turn 2"),
                         ([said[0], {"role": "", "content": "x"}], "turn 2")]:
        with pytest.raises(InvalidInput, match=problem):
            shelf.log_messages(KALEB, "t1", bad)
    assert len(shelf.messages(KALEB, "t1")) == 3  # nothing of a refused batch was kept
    assert shelf.log_messages(KALEB, "t2", []) == [] and shelf.messages(KALEB, "t2") == []
    with pytest.raises(InvalidInput):
        shelf.log_messages(KALEB, "t1", said[0])  # one turn, not a list of them


def test_several_messages_are_erased_all_or_none(shelf):
    said = shelf.log_messages(KALEB, "t1", [{"role": "user", "content": f"part {i}"} for i in range(3)])
    other = shelf.log_message(MAYA, "t1", "user", "another owner's turn")
    for ids, refusal in [([said[0].id, other.id], NotFound), ([said[0].id, "msg_0000000000000000"], NotFound),
                         ([said[0].id, "not-an-id"], InvalidInput), (said[0].id, InvalidInput)]:
        with pytest.raises(refusal):
            shelf.forget_messages(KALEB, ids)
    assert len(shelf.messages(KALEB, "t1")) == 3 and len(shelf.messages(MAYA, "t1")) == 1  # nothing went
    erased = shelf.forget_messages(KALEB, [said[2].id, said[0].id, said[2].id])
    assert erased.messages == 2
    assert [m.content for m in shelf.messages(KALEB, "t1")] == ["part 1"]


def test_messages_have_their_own_retention(open_shelf, clock):
    shelf = open_shelf(clock=clock, message_ttl=timedelta(days=1))
    shelf.log_message(KALEB, "t1", "user", "hello")
    shelf.remember(KALEB, "t", "A durable statement.")
    clock.advance(86_400)
    assert shelf.messages(KALEB, "t1") == []
    assert len(shelf.search(KALEB, "durable")) == 1


def test_message_pages_reach_back_past_the_newest_thousand(shelf, clock):
    for i in range(1_205):
        shelf.log_message(KALEB, "long" if i % 2 else "short", "user", f"turn {i}",
                          **({"ttl": 60} if i == 1_203 else {}))
    shelf.log_message(MAYA, "long", "user", "another owner's turn")
    clock.advance(61)  # turn 1203 has expired
    pages, cursor = [], None
    while True:
        page, cursor = shelf.list_messages(KALEB, "long", limit=250, cursor=cursor)
        pages.append(page)
        if cursor is None:
            break
    seen = [m.content for page in pages for m in page]
    assert seen == [f"turn {i}" for i in range(1_201, 0, -2)]  # newest first, every live one, nothing else
    assert [len(p) for p in pages] == [250, 250, 101]
    everything, end = shelf.list_messages(KALEB, limit=1_000)
    assert len(everything) == 1_000 and end is not None
    assert len(shelf.list_messages(KALEB, limit=1_000, cursor=end)[0]) == 204
    with pytest.raises(InvalidInput, match="cursor"):
        shelf.list_messages(KALEB, cursor="offset:3")


# ---------------------------------------------------------------- erasure
def test_forget_user_erases_every_kind_of_record(shelf):
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    shelf.set_fact(KALEB, "user_name", "Kal")
    shelf.log_message(KALEB, "t1", "user", "hi")
    erased = shelf.forget_user(KALEB)
    assert erased.as_dict() == {"memories": 1, "facts": 1, "fact_changes": 2, "messages": 1,
                                "scrub_pending": shelf.store.scrub_pending}
    assert [r["kind"] for r in shelf.export(KALEB)] == ["memshelf-export"]


def test_scrub_finishes_what_erasures_left_for_later(shelf):
    """Whether an erasure leaves its scrub for later is the backend's to say (Erased.scrub_pending); with no other
    connection reading, Shelf.scrub() finishes it, and the records stay gone."""
    memory = shelf.remember(KALEB, "secrets", "The safe word is xylophagous.")
    shelf.set_fact(KALEB, "locker", "4471")
    assert shelf.forget(KALEB, memory.id).scrub_pending == shelf.store.scrub_pending
    assert shelf.forget_fact(KALEB, "locker").scrub_pending == shelf.store.scrub_pending
    assert shelf.scrub() is False
    assert shelf.store.scrub_pending is False
    assert shelf.search(KALEB, "xylophagous") == [] and shelf.facts(KALEB) == []
    assert shelf.scrub() is False  # nothing left: a no-op


def test_forget_tenant_erases_all_its_users(shelf):
    shelf.remember(KALEB, "a", "one")
    shelf.remember(SAME_TENANT_OTHER_USER, "a", "two")
    shelf.remember(SAME_USER_OTHER_TENANT, "a", "three")
    assert shelf.forget_tenant("home").memories == 2
    assert count_memories(shelf, SAME_USER_OTHER_TENANT) == 1


# ---------------------------------------------------------------- export / import
def _jsonl(records):
    return "\n".join(json.dumps(r, sort_keys=True) for r in records)


def test_export_import_round_trips_exactly(shelf, open_shelf, clock, tmp_path):
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined", ttl=3600)
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    shelf.set_fact(KALEB, "user_name", "Kal")
    clock.advance(1)
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    shelf.log_message(KALEB, "t1", "user", "hello 👋")
    exported = _jsonl(shelf.export(KALEB))
    counts = shelf.import_(MAYA, (json.loads(line) for line in exported.splitlines()))
    assert counts == {"memories": 2, "facts": 1, "messages": 1}
    assert _jsonl(shelf.export(MAYA)) == exported
    assert shelf.import_(MAYA, (json.loads(line) for line in exported.splitlines())) == {
        "memories": 0, "facts": 0, "messages": 0}


def test_an_import_weighs_its_facts_against_the_owners_by_source_and_time(shelf, clock):
    """The owner's current fact after an import is what replaying its history with the import's gives (by time, a
    weaker source never replacing a stronger one), so facts() and facts(as_of=now) agree. Before, a fact the owner
    held was never replaced by an import, and as_of replayed the history in the order rows were written."""
    shelf.set_fact(KALEB, "city", "Madrid")  # stated, in the export
    exported = list(shelf.export(KALEB))
    clock.advance(60)
    guessed, stated = Owner(KALEB.tenant, "guessed"), Owner(KALEB.tenant, "stated")
    shelf.set_fact(guessed, "city", "Rome", "inferred")  # a later guess: the imported statement outranks it
    shelf.set_fact(stated, "city", "Rome")  # a later statement: it stays
    for owner, value, source in ((guessed, "Madrid", "stated"), (stated, "Rome", "stated")):
        shelf.import_(owner, exported)
        assert [(f.value, f.source) for f in shelf.facts(owner)] == [(value, source)]
        assert [(f.value, f.source) for f in shelf.facts(owner, as_of=shelf.now())] == [(value, source)]
        assert sorted(c.value for c in shelf.fact_history(owner, "city")) == ["Madrid", "Rome"]
        assert shelf.import_(owner, exported)["facts"] == 0  # again: nothing new


def test_malformed_import_imports_nothing(shelf):
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    records = list(shelf.export(KALEB))
    broken = records + [{"kind": "memory", "topic": "x"}]
    with pytest.raises(InvalidInput, match="record 3"):
        shelf.import_(MAYA, broken)
    assert count_memories(shelf, MAYA) == 0
    with pytest.raises(UnknownSource):
        shelf.import_(MAYA, [dict(records[1], source="gossip")])


# ---------------------------------------------------------------- atomicity
def test_failure_half_way_leaves_nothing_behind(shelf):
    with pytest.raises(RuntimeError):
        with shelf.store.atomic():
            shelf.remember(KALEB, "a", "first")
            with shelf.store.atomic():
                shelf.set_fact(KALEB, "k", "v")
            raise RuntimeError("boom")
    assert count_memories(shelf, KALEB) == 0 and shelf.facts(KALEB) == []


def test_inner_failure_rolls_back_only_the_inner_block(shelf):
    with shelf.store.atomic():
        shelf.remember(KALEB, "a", "kept")
        with pytest.raises(RuntimeError):
            with shelf.store.atomic():
                shelf.remember(KALEB, "a", "dropped")
                raise RuntimeError("boom")
    assert [r["content"] for r in shelf.export(KALEB) if r["kind"] == "memory"] == ["kept"]


def test_paging_walks_every_memory_once(shelf, clock):
    for i in range(7):
        shelf.remember(KALEB, "t", f"line {i}")
    seen, cursor = [], None
    while True:
        page, cursor = shelf.list_memories(KALEB, limit=3, cursor=cursor)
        seen += [m.content for m in page]
        if cursor is None:
            break
    assert seen == [f"line {i}" for i in reversed(range(7))]
    with pytest.raises(InvalidInput, match="cursor"):
        shelf.list_memories(KALEB, cursor="bogus")


def _walk(shelf, owner, **listing):
    """Every page of a listing, as (content, pages walked)."""
    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = shelf.list_memories(owner, limit=2, cursor=cursor, **listing)
        seen, pages = seen + [m.content for m in page], pages + 1
        if cursor is None:
            return seen, pages


def test_listing_filters_by_topic_source_and_text_and_orders_by_confidence(shelf, clock):
    for topic, content, source in [("network", "The printer is on 192.168.1.40.", "inferred"),
                                   ("network", "The router is an ASUS.", "stated"),
                                   ("food", "Kaleb likes green TEA.", "mined"),
                                   ("network", "The NAS is in the closet.", "mined"),
                                   ("food", "Kaleb drinks 100% juice_box.", "stated")]:
        shelf.remember(KALEB, topic, content, source)
        clock.advance(1)
    shelf.remember(MAYA, "network", "Maya's printer is in the hall.")
    assert _walk(shelf, KALEB, topic="network")[0] == [
        "The NAS is in the closet.", "The router is an ASUS.", "The printer is on 192.168.1.40."]
    assert _walk(shelf, KALEB, source="mined")[0] == ["The NAS is in the closet.", "Kaleb likes green TEA."]
    assert _walk(shelf, KALEB, contains="tea")[0] == ["Kaleb likes green TEA."]
    assert _walk(shelf, KALEB, contains="PRINTER")[0] == ["The printer is on 192.168.1.40."]
    assert _walk(shelf, KALEB, contains="ood")[0] == ["Kaleb drinks 100% juice_box.", "Kaleb likes green TEA."]
    assert _walk(shelf, KALEB, contains="0% juice_")[0] == ["Kaleb drinks 100% juice_box."]  # % and _ as written
    assert _walk(shelf, KALEB, contains="   ")[0] == _walk(shelf, KALEB)[0]  # blank: no filter
    assert _walk(shelf, KALEB, source="", topic=" ")[0] == _walk(shelf, KALEB)[0]
    assert _walk(shelf, KALEB, topic="network", source="mined", contains="nas")[0] == ["The NAS is in the closet."]
    by_confidence, pages = _walk(shelf, KALEB, order="confident")
    assert by_confidence == ["Kaleb drinks 100% juice_box.", "The router is an ASUS.", "The NAS is in the closet.",
                             "Kaleb likes green TEA.", "The printer is on 192.168.1.40."]
    assert pages == 3
    assert _walk(shelf, MAYA, contains="printer")[0] == ["Maya's printer is in the hall."]
    for stranger in STRANGERS:
        assert _walk(shelf, stranger, contains="printer")[0] == []


def test_a_cursor_goes_with_its_order_and_its_owner(shelf):
    for i in range(3):
        shelf.remember(KALEB, "t", f"line {i}")
    newest = shelf.list_memories(KALEB, limit=1)[1]
    confident = shelf.list_memories(KALEB, limit=1, order="confident")[1]
    with pytest.raises(InvalidInput, match="order=confident"):
        shelf.list_memories(KALEB, cursor=newest, order="confident")
    with pytest.raises(InvalidInput, match="cursor"):
        shelf.list_memories(KALEB, cursor=confident)
    with pytest.raises(InvalidInput, match="cursor"):
        shelf.list_memories(SAME_TENANT_OTHER_USER, cursor=confident, order="confident")
    with pytest.raises(InvalidInput, match="order"):
        shelf.list_memories(KALEB, order="oldest")
    with pytest.raises(UnknownSource, match="crm"):
        shelf.list_memories(KALEB, source="crm")


def test_superseded_memories_are_listed_on_request_with_what_replaced_them(shelf, clock):
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    clock.advance(10)
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.")
    shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    assert [m.id for m in shelf.list_memories(KALEB)[0]] == [new.id]
    listed = shelf.list_memories(KALEB, include_superseded=True)[0]
    assert [(m.id, m.superseded_by) for m in listed] == [(new.id, None), (old.id, new.id)]


def test_confirming_makes_a_guess_stated_and_records_when_and_from_what(shelf, clock):
    guess = shelf.remember(KALEB, "network", "The printer is on 192.168.1.40.", "inferred")
    said = shelf.remember(KALEB, "network", "The router is an ASUS.")
    clock.advance(60)
    confirmed = shelf.confirm(KALEB, guess.id)
    assert (confirmed.source, confirmed.confidence, confirmed.confirmed_at, confirmed.confirmed_from) == (
        "stated", 1.0, shelf.now(), "inferred")
    assert shelf.get(KALEB, guess.id) == confirmed
    assert (confirmed.content, confirmed.created_at) == (guess.content, guess.created_at)
    assert shelf.search(KALEB, "printer")[0].memory.source == "stated"
    assert shelf.confirm(KALEB, said.id) == said  # already stated: unchanged, no confirmation recorded
    clock.advance(60)
    assert shelf.confirm(KALEB, guess.id) == confirmed  # a second confirmation changes nothing
    record = next(r for r in shelf.export(KALEB) if r.get("id") == guess.id)
    assert (record["source"], record["confirmed_from"]) == ("stated", "inferred")
    shelf.import_(MAYA, list(shelf.export(KALEB)))
    assert shelf.get(MAYA, guess.id).confirmed_from == "inferred"
    for stranger in STRANGERS:
        with pytest.raises(NotFound):
            shelf.confirm(stranger, guess.id)


def test_a_superseded_memory_cannot_be_confirmed(shelf, clock):
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.", "inferred")
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.", "inferred")
    shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    with pytest.raises(Conflict, match=new.id):
        shelf.confirm(KALEB, old.id)
    assert shelf.get(KALEB, old.id).source == "inferred"


def test_a_superseded_memory_said_again_holds_again(shelf, clock):
    """Confirm's advice for a superseded memory: remember its text again. A repeat at least as confident as what
    replaced it makes it current again; a weaker one is counted, and it stays closed."""
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.", "mined")
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.", "mined")
    shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    guessed = shelf.remember(KALEB, "home", "Kaleb lives in Porto.", "inferred")
    assert (guessed.id, guessed.superseded_by, guessed.observations) == (old.id, new.id, 2)
    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Lisbon."]
    clock.advance(5)
    said = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    assert (said.id, said.superseded_at, said.superseded_by, said.source) == (old.id, None, None, "stated")
    assert sorted(contents(shelf.search(KALEB, "Kaleb lives"))) == ["Kaleb lives in Lisbon.", "Kaleb lives in Porto."]
    assert shelf.confirm(KALEB, old.id).superseded_at is None


def test_a_repeat_does_not_reopen_what_a_statement_replaced(shelf, clock):
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.", "mined")
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.", ttl=60)
    shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    assert shelf.remember(KALEB, "home", "Kaleb lives in Porto.", "mined").superseded_by == new.id
    assert shelf.remember(KALEB, "home", "Kaleb lives in Porto.", "inferred").superseded_by == new.id
    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Lisbon."]
    clock.advance(61)
    shelf.purge_expired()  # what replaced it expired and is gone (a purge gives no place back): it stays closed
    assert shelf.get(KALEB, old.id).superseded_by == new.id and contents(shelf.search(KALEB, "Kaleb lives")) == []
    assert shelf.remember(KALEB, "home", "Kaleb lives in Porto.", "mined").superseded_at is None  # nothing outranks
    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Porto."]


def test_erasing_a_memory_gives_its_place_back_to_the_one_it_replaced(shelf, clock):
    """As though the erased memory had never been written: what it closed is current again, or, if something had
    closed it in turn, closed by that at that instant; no erased id stays behind in superseded_by."""
    porto = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    clock.advance(10)
    lisbon = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.", "inferred")
    shelf.store.supersede_memory(KALEB, porto.id, lisbon.id, shelf.now())
    clock.advance(10)
    between = shelf.now()
    clock.advance(10)
    faro = shelf.remember(KALEB, "home", "Kaleb lives in Faro.")
    shelf.store.supersede_memory(KALEB, lisbon.id, faro.id, shelf.now())
    moved = shelf.now()
    clock.advance(10)

    assert shelf.forget(KALEB, lisbon.id).memories == 1
    back = shelf.get(KALEB, porto.id)
    assert (back.superseded_by, back.superseded_at) == (faro.id, moved)
    assert contents(shelf.search(KALEB, "Kaleb lives", as_of=between)) == ["Kaleb lives in Porto."]
    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Faro."]

    shelf.forget(KALEB, faro.id)
    assert (shelf.get(KALEB, porto.id).superseded_by, shelf.get(KALEB, porto.id).superseded_at) == (None, None)
    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Porto."]
    assert "Porto" in shelf.context(KALEB, "where does Kaleb live")
    assert [m.id for m in shelf.list_memories(KALEB)[0]] == [porto.id]


def test_erasing_what_replaced_another_owners_memory_leaves_it_alone(shelf):
    theirs = shelf.remember(SAME_TENANT_OTHER_USER, "home", "Maya lives in Porto.")
    replacing = shelf.remember(SAME_TENANT_OTHER_USER, "home", "Maya lives in Lisbon.")
    shelf.store.supersede_memory(SAME_TENANT_OTHER_USER, theirs.id, replacing.id, shelf.now())
    for stranger in [KALEB, SAME_USER_OTHER_TENANT]:
        with pytest.raises(NotFound):
            shelf.forget(stranger, replacing.id)
    assert shelf.get(SAME_TENANT_OTHER_USER, theirs.id).superseded_by == replacing.id


def test_erasing_one_of_two_memories_that_closed_each_other_leaves_the_other_current(shelf):
    first = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    second = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.")
    shelf.store.supersede_memory(KALEB, first.id, second.id, shelf.now())
    shelf.store.supersede_memory(KALEB, second.id, first.id, shelf.now())  # the store allows it: both closed
    assert contents(shelf.search(KALEB, "Kaleb lives")) == []
    shelf.forget(KALEB, second.id)
    assert [m.content for m in shelf.list_memories(KALEB)[0]] == ["Kaleb lives in Porto."]
    assert shelf.get(KALEB, first.id).superseded_by is None


def test_an_expiry_can_be_set_moved_and_removed(shelf, clock):
    memory = shelf.remember(KALEB, "network", "The guest Wi-Fi password is tulip.", ttl=60)
    assert shelf.set_expiry(KALEB, memory.id, ttl=3600).expires_at == shelf.now() + timedelta(seconds=3600)
    clock.advance(120)
    assert shelf.get(KALEB, memory.id).content == memory.content  # it would have expired at 60 s
    when = shelf.now() + timedelta(days=2)
    assert shelf.set_expiry(KALEB, memory.id, expires_at=when).expires_at == when
    assert shelf.set_expiry(KALEB, memory.id).expires_at is None
    shelf.set_expiry(KALEB, memory.id, ttl=10)
    clock.advance(11)
    with pytest.raises(NotFound, match="no expiry was changed"):
        shelf.set_expiry(KALEB, memory.id, ttl=60)  # expired is gone: nothing to revive
    with pytest.raises(InvalidInput, match="already passed"):
        shelf.set_expiry(KALEB, shelf.remember(KALEB, "a", "b").id, expires_at=shelf.now() - timedelta(1))
    for stranger in STRANGERS:
        with pytest.raises(NotFound):
            shelf.set_expiry(stranger, shelf.remember(KALEB, "a", "b").id, ttl=5)


def test_every_search_mode_shows_its_working(shelf):
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    hit = shelf.search(KALEB, "printer", mode="keyword")[0]
    assert set(hit.details) == {"keyword_rank", "keyword_score"}
    assert hit.details["keyword_rank"] == 1 and hit.details["keyword_score"] == pytest.approx(hit.score, abs=1e-6)


@pytest.mark.parametrize("floor", [1.5, -2, float("nan"), "0.3", True])
def test_a_bad_floor_is_refused(shelf, floor):
    with pytest.raises(InvalidInput, match="floor"):
        shelf.search(KALEB, "printer", floor=floor)


# ---------------------------------------------------------------- supersession, watermarks, evidence
def test_a_superseded_memory_keeps_its_text_and_leaves_current_reads(shelf, clock):
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    clock.advance(10)
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.")
    assert shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    assert not shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())  # already closed
    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Lisbon."]
    assert shelf.context(KALEB, "where does Kaleb live") == shelf.context(KALEB, "Lisbon")
    assert "Porto" not in shelf.build_prompt("base", KALEB, "where does Kaleb live")
    assert [m.id for m in shelf.list_memories(KALEB)[0]] == [new.id]
    closed = shelf.get(KALEB, old.id)
    assert (closed.content, closed.superseded_at, closed.superseded_by) == (
        "Kaleb lives in Porto.", shelf.now(), new.id)
    assert sorted(contents(shelf.search(KALEB, "Kaleb lives", include_superseded=True))) == [
        "Kaleb lives in Lisbon.", "Kaleb lives in Porto."]


def test_as_of_sees_what_was_current_then(shelf, clock):
    start = shelf.now()
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    clock.advance(10)
    between = shelf.now()
    clock.advance(10)
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.")
    shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    clock.advance(10)
    assert contents(shelf.search(KALEB, "Kaleb lives", as_of=between)) == ["Kaleb lives in Porto."]
    assert contents(shelf.search(KALEB, "Kaleb lives", as_of=shelf.now())) == ["Kaleb lives in Lisbon."]
    assert contents(shelf.search(KALEB, "Kaleb lives", as_of=start - timedelta(seconds=1))) == []
    assert "Porto" in shelf.context(KALEB, "where does Kaleb live", as_of=between)
    with pytest.raises(InvalidInput, match="as_of"):
        shelf.search(KALEB, "Kaleb", as_of=datetime(2026, 1, 1))  # naive


def test_nobody_supersedes_another_owners_memory(shelf):
    theirs = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    mine = shelf.remember(MAYA, "home", "Maya lives in Faro.")
    for stranger in STRANGERS + [MAYA]:
        assert not shelf.store.supersede_memory(stranger, theirs.id, mine.id, shelf.now())
    assert shelf.get(KALEB, theirs.id).superseded_at is None


def test_facts_as_of_read_the_history(shelf, clock):
    shelf.set_fact(KALEB, "home_city", "Porto")
    clock.advance(10)
    between = shelf.now()
    clock.advance(10)
    shelf.set_fact(KALEB, "home_city", "Lisbon")
    shelf.set_fact(KALEB, "home_city", "a guess", source="inferred")  # kept in history only: weaker than stated
    assert [f.value for f in shelf.facts(KALEB)] == ["Lisbon"]
    assert [f.value for f in shelf.facts(KALEB, as_of=between)] == ["Porto"]
    assert [f.value for f in shelf.facts(KALEB, as_of=shelf.now())] == ["Lisbon"]
    assert "Porto" in shelf.build_prompt("base", KALEB, "", as_of=between)


def test_a_threads_watermark_reads_only_later_messages(shelf, clock):
    first = shelf.log_message(KALEB, "t1", "user", "one")
    second = shelf.log_message(KALEB, "t1", "user", "two")  # the same instant: ordered by when it was written
    shelf.log_message(KALEB, "t2", "user", "elsewhere")
    clock.advance(1)
    third = shelf.log_message(KALEB, "t1", "user", "three")
    store = shelf.store
    assert store.learn_mark(KALEB, "t1") is None
    assert [m.id for m in store.messages_after(KALEB, "t1", None, 10, shelf.now())] == [first.id, second.id, third.id]
    store.set_learn_mark(KALEB, "t1", Mark(first.id, first.created_at), shelf.now())
    mark = store.learn_mark(KALEB, "t1")
    assert mark == Mark(first.id, first.created_at)
    assert [m.id for m in store.messages_after(KALEB, "t1", mark, 10, shelf.now())] == [second.id, third.id]
    assert [m.id for m in store.messages_after(KALEB, "t1", mark, 1, shelf.now())] == [second.id]
    store.set_learn_mark(KALEB, "t1", Mark(third.id, third.created_at), shelf.now())
    assert store.messages_after(KALEB, "t1", store.learn_mark(KALEB, "t1"), 10, shelf.now()) == []
    assert store.learn_mark(MAYA, "t1") is None and store.learn_marks(KALEB) == {"t1": Mark(third.id, third.created_at)}


def test_evidence_is_kept_per_record_and_erased_with_it(shelf):
    memory = shelf.remember(KALEB, "pets", "Kaleb has a cat.")
    message = shelf.log_message(KALEB, "t1", "user", "I have a cat.")
    rows = [Evidence("memory", memory.id, message.id, "t1", message.created_at),
            Evidence("fact", "pet", message.id, "t1", message.created_at)]
    shelf.store.add_evidence(KALEB, rows)
    assert shelf.evidence(KALEB, memory_id=memory.id) == rows[:1]
    assert shelf.evidence(KALEB, key="pet") == rows[1:]
    assert shelf.evidence(MAYA, memory_id=memory.id) == []
    assert shelf.evidence(KALEB) == rows  # everything learned, for an inspector
    assert shelf.evidence(MAYA) == []
    shelf.forget(KALEB, memory.id)
    assert shelf.evidence(KALEB, memory_id=memory.id) == []
    with pytest.raises(InvalidInput, match="not both"):
        shelf.evidence(KALEB, memory_id=memory.id, key="pet")


def test_one_message_is_erased_with_the_evidence_citing_it(shelf):
    memory = shelf.remember(KALEB, "pets", "Kaleb has a cat.")
    said = shelf.log_message(KALEB, "t1", "user", "I have a cat.")
    kept = shelf.log_message(KALEB, "t1", "user", "It is grey.")
    shelf.store.add_evidence(KALEB, [Evidence("memory", memory.id, said.id, "t1", said.created_at)])
    for stranger in STRANGERS:
        with pytest.raises(NotFound):
            shelf.forget_message(stranger, said.id)
    assert shelf.forget_message(KALEB, said.id).messages == 1
    assert [m.id for m in shelf.messages(KALEB, "t1")] == [kept.id]
    assert shelf.evidence(KALEB, memory_id=memory.id) == [] and shelf.get(KALEB, memory.id) == memory
    with pytest.raises(NotFound, match="nothing was deleted"):
        shelf.forget_message(KALEB, said.id)
    with pytest.raises(InvalidInput, match="message id"):
        shelf.forget_message(KALEB, memory.id)


def test_forget_thread_erases_its_messages_and_watermark_and_cascades_by_evidence(shelf):
    only_here = shelf.remember(KALEB, "pets", "Kaleb has a cat.")
    also_elsewhere = shelf.remember(KALEB, "pets", "Kaleb has a dog.")
    written = shelf.remember(KALEB, "pets", "Kaleb had a parrot.")
    here = shelf.log_message(KALEB, "t1", "user", "I have a cat and a dog.")
    there = shelf.log_message(KALEB, "t2", "user", "I have a dog.")
    shelf.set_fact(KALEB, "pet", "cat")
    shelf.set_fact(KALEB, "pet", "cat and dog")
    shelf.set_fact(KALEB, "home_city", "Porto")
    shelf.store.add_evidence(KALEB, [
        Evidence("memory", only_here.id, here.id, "t1", here.created_at),
        Evidence("memory", also_elsewhere.id, here.id, "t1", here.created_at),
        Evidence("memory", also_elsewhere.id, there.id, "t2", there.created_at),
        Evidence("fact", "pet", here.id, "t1", here.created_at)])
    shelf.store.set_learn_mark(KALEB, "t1", Mark(here.id, here.created_at), shelf.now())

    erased = shelf.forget_thread(KALEB, "t1", cascade=True)

    assert erased.as_dict() == {"memories": 1, "facts": 1, "fact_changes": 2, "messages": 1,
                                "scrub_pending": shelf.store.scrub_pending}
    assert sorted(m.content for m in shelf.list_memories(KALEB)[0]) == ["Kaleb had a parrot.", "Kaleb has a dog."]
    assert [f.key for f in shelf.facts(KALEB)] == ["home_city"] and shelf.fact_history(KALEB, "pet") == []
    assert shelf.messages(KALEB, "t1") == [] and [m.id for m in shelf.messages(KALEB, "t2")] == [there.id]
    assert shelf.store.learn_mark(KALEB, "t1") is None
    assert [e.thread for e in shelf.evidence(KALEB, memory_id=also_elsewhere.id)] == ["t2"]
    assert shelf.get(KALEB, written.id).content == "Kaleb had a parrot."


def test_forget_thread_gives_back_what_its_learned_memories_replaced(shelf, clock):
    """A memory learned only from the thread goes with it, and what it had replaced holds again (as a fact's
    earlier value does), even when a memory learned later in the same thread had replaced it in turn."""
    porto = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    lisbon = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.", "mined")
    faro = shelf.remember(KALEB, "home", "Kaleb lives in Faro.", "mined")
    shelf.store.supersede_memory(KALEB, porto.id, lisbon.id, shelf.now())
    clock.advance(10)
    shelf.store.supersede_memory(KALEB, lisbon.id, faro.id, shelf.now())
    said = shelf.log_message(KALEB, "t1", "user", "I moved to Lisbon, and then to Faro.")
    shelf.store.add_evidence(KALEB, [Evidence("memory", learned.id, said.id, "t1", said.created_at)
                                     for learned in (lisbon, faro)])
    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Faro."]

    assert shelf.forget_thread(KALEB, "t1", cascade=True).memories == 2

    assert contents(shelf.search(KALEB, "Kaleb lives")) == ["Kaleb lives in Porto."]
    assert shelf.get(KALEB, porto.id).superseded_at is None


def test_a_learned_memory_the_caller_writes_again_is_the_callers(shelf):
    """What the caller said is never undone by forgetting a conversation: a memory learned from a thread and then
    remembered by the caller (the same topic and text) loses its evidence, and forget_thread's cascade keeps it."""
    said = shelf.log_message(KALEB, "t1", "user", "Remember that the gate code is 4711.")
    learned = shelf.remember(KALEB, "home", "The gate code is 4711.", "mined")
    other = shelf.remember(KALEB, "home", "The bins go out on Tuesday.", "mined")
    shelf.store.add_evidence(KALEB, [Evidence("memory", memory.id, said.id, "t1", said.created_at)
                                     for memory in (learned, other)])
    for stranger in STRANGERS:
        assert shelf.store.drop_evidence(stranger, "memory", [learned.id]) == 0
    assert len(shelf.evidence(KALEB, memory_id=learned.id)) == 1
    again = shelf.remember_many(KALEB, [{"topic": "home", "content": "The gate code is 4711."},
                                        {"topic": "home", "content": "The garage is unlocked."}])[0]
    assert (again.id, again.observations, again.source) == (learned.id, 2, "stated")
    assert shelf.evidence(KALEB, memory_id=learned.id) == []
    assert [e.record for e in shelf.evidence(KALEB)] == [other.id]

    assert shelf.forget_thread(KALEB, "t1", cascade=True).memories == 1
    assert sorted(m.content for m in shelf.list_memories(KALEB)[0]) == ["The garage is unlocked.",
                                                                         "The gate code is 4711."]


def test_forget_thread_gives_a_fact_back_by_source_or_for_a_caller_without_a_rule_by_time(shelf, clock):
    """The taught value goes; what the fact holds then is the remaining history replayed with set_fact's rule
    (outranks, as the Shelf passes it), or, for a caller of the store that passes none, the latest value left."""
    for owner in (KALEB, MAYA):
        shelf.set_fact(owner, "home_city", "Porto")
        clock.advance(10)
        shelf.set_fact(owner, "home_city", "Braga", "inferred")  # weaker: history only
        clock.advance(10)
        said = shelf.log_message(owner, "t1", "user", "I moved to Lisbon.")
        taught = shelf.set_fact(owner, "home_city", "Lisbon")
        shelf.store.add_evidence(owner, [Evidence("fact", "home_city", said.id, "t1", said.created_at,
                                                  taught.updated_at)])
    assert shelf.forget_thread(KALEB, "t1", cascade=True).fact_changes == 1
    assert [(f.value, f.source) for f in shelf.facts(KALEB)] == [("Porto", "stated")]
    assert shelf.store.forget_thread(MAYA, "t1", True).fact_changes == 1
    assert [(f.value, f.source) for f in shelf.facts(MAYA)] == [("Braga", "inferred")]


def test_forget_thread_without_cascade_keeps_what_was_learned(shelf):
    memory = shelf.remember(KALEB, "pets", "Kaleb has a cat.")
    here = shelf.log_message(KALEB, "t1", "user", "I have a cat.")
    shelf.store.add_evidence(KALEB, [Evidence("memory", memory.id, here.id, "t1", here.created_at)])
    assert shelf.forget_thread(KALEB, "t1").as_dict()["messages"] == 1
    assert shelf.get(KALEB, memory.id).content == "Kaleb has a cat."
    assert shelf.evidence(KALEB, memory_id=memory.id) == []  # it pointed at erased messages
    assert shelf.forget_thread(MAYA, "t1").as_dict()["messages"] == 0


def test_export_import_carries_supersession_evidence_and_watermarks(shelf, clock):
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    clock.advance(1)
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.")
    shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())
    message = shelf.log_message(KALEB, "t1", "user", "I moved to Lisbon.")
    shelf.store.add_evidence(KALEB, [Evidence("memory", new.id, message.id, "t1", message.created_at)])
    shelf.store.set_learn_mark(KALEB, "t1", Mark(message.id, message.created_at), shelf.now())
    exported = _jsonl(shelf.export(KALEB))
    counts = shelf.import_(MAYA, (json.loads(line) for line in exported.splitlines()))
    assert counts == {"memories": 2, "facts": 0, "messages": 1, "evidence": 1, "learn_marks": 1}
    assert _jsonl(shelf.export(MAYA)) == exported
    assert shelf.get(MAYA, old.id).superseded_by == new.id
    assert contents(shelf.search(MAYA, "Kaleb lives")) == ["Kaleb lives in Lisbon."]
    assert shelf.import_(MAYA, (json.loads(line) for line in exported.splitlines())) == {
        "memories": 0, "facts": 0, "messages": 0, "evidence": 0, "learn_marks": 0}


# ---------------------------------------------------------------- a tenant's users
def test_users_are_listed_with_their_live_records_counted(shelf, clock):
    old = shelf.remember(KALEB, "home", "Kaleb lives in Porto.")
    clock.advance(1)
    new = shelf.remember(KALEB, "home", "Kaleb lives in Lisbon.")
    shelf.store.supersede_memory(KALEB, old.id, new.id, shelf.now())  # superseded: not counted
    shelf.remember(KALEB, "note", "Gone in a minute.", ttl=60)
    shelf.set_fact(KALEB, "user_name", "Kal")
    shelf.set_fact(KALEB, "user_name", "Kaleb")  # one fact, however often it changed
    shelf.set_fact(KALEB, "city", "Lisbon")
    shelf.log_message(KALEB, "t1", "user", "I moved to Lisbon.")
    shelf.log_message(KALEB, "t1", "user", "Gone in a minute too.", ttl=60)
    clock.advance(1)
    shelf.set_fact(SAME_TENANT_OTHER_USER, "user_name", "Maya")
    maya_set_at = shelf.now()
    shelf.remember(Owner("home", "ghost"), "note", "Only this, and it expires.", ttl=30)
    shelf.remember(SAME_USER_OTHER_TENANT, "home", "Another tenant's Kaleb.")
    shelf.remember(Owner("other", "zoe"), "home", "Another tenant's user.")
    # Kaleb's last write is the second user_name: set in the instant of the first, it is stamped a microsecond on.
    kaleb_active_at = shelf.now() - timedelta(seconds=1) + timedelta(microseconds=1)
    clock.advance(61)  # the ttl'd memories and message have expired: ghost has nothing live left
    users, cursor = shelf.list_users("home")
    assert cursor is None
    assert users == [UserSummary("kaleb", memories=1, facts=2, messages=1, newest_at=kaleb_active_at),
                     UserSummary("maya", memories=0, facts=1, messages=0, newest_at=maya_set_at)]
    assert [u.user for u in shelf.list_users("other")[0]] == ["kaleb", "zoe"]
    assert shelf.list_users("nobody") == ([], None)


def test_user_pages_reach_every_user_exactly_once(shelf):
    names = [f"user{i:02d}" for i in range(23)]
    writes = [lambda owner: shelf.remember(owner, "t", "a line"), lambda owner: shelf.set_fact(owner, "k", "v"),
              lambda owner: shelf.log_message(owner, "t1", "user", "hi")]
    for i, name in enumerate(names):  # each kind of record alone makes a user
        writes[i % 3](Owner("home", name))
    shelf.remember(Owner("other", "user05b"), "t", "another tenant's user, between two of home's")
    pages, cursor = [], None
    while True:
        page, cursor = shelf.list_users("home", limit=5, cursor=cursor)
        pages.append([u.user for u in page])
        if cursor is None:
            break
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [name for page in pages for name in page] == names
    _, cursor = shelf.list_users("home", limit=5)
    with pytest.raises(InvalidInput, match="cursor"):
        shelf.list_users("other", cursor=cursor)  # one tenant's cursor is no other tenant's
    shelf.remember(MAYA, "t", "one")
    shelf.remember(MAYA, "t", "two")
    memories_cursor = shelf.list_memories(MAYA, limit=1)[1]
    with pytest.raises(InvalidInput, match="cursor"):
        shelf.list_users("acme", cursor=memories_cursor)  # nor is a cursor of memories
    with pytest.raises(InvalidInput, match="cursor"):
        shelf.list_memories(MAYA, cursor=shelf.list_users("acme", limit=1)[1] or "")
    with pytest.raises(InvalidInput, match="limit"):
        shelf.list_users("home", limit=0)
    tag = json.loads(base64.urlsafe_b64decode(cursor[3:] + "==="))[0]
    for forged in ["user\x00", "\ud800", ""]:  # the tenant's own tag, with a user id no store can take
        payload = json.dumps([tag, forged]).encode()
        with pytest.raises(InvalidInput, match="cursor"):
            shelf.list_users("home", cursor="c1." + base64.urlsafe_b64encode(payload).decode())


def test_users_filtered_by_text_their_id_contains(shelf):
    for name in ["a%b", "axb", "aXb", "a_b", "ab", "c\\d", "Émile", "EMMA"]:
        shelf.set_fact(Owner("home", name), "k", "v")
    shelf.set_fact(Owner("other", "a%b2"), "k", "v")

    def matching(text):
        return {u.user for u in shelf.list_users("home", contains=text)[0]}

    assert matching("%") == {"a%b"}  # a LIKE wildcard is a plain character
    assert matching("_") == {"a_b"}
    assert matching("\\") == {"c\\d"}
    assert matching("X") == matching("x") == {"axb", "aXb"}  # ASCII letters in either case
    assert matching("em") == {"EMMA"}  # É is not folded: only ASCII letters are
    assert matching("Ém") == {"Émile"}
    assert matching("nobody") == set()
    assert len(matching("")) == len(matching(None)) == 8  # no filter
    page, cursor = shelf.list_users("home", contains="a", limit=2)
    assert len(page) == 2 and cursor is not None
    rest = shelf.list_users("home", contains="a", cursor=cursor)[0]
    assert {u.user for u in page + rest} == {"a%b", "axb", "aXb", "a_b", "ab", "EMMA"}
    for bad in ["x" * 201, "a\x00b", 3]:
        with pytest.raises(InvalidInput, match="contains"):
            shelf.list_users("home", contains=bad)


# What `from memshelf.testing.contract import *` brings into a test module: every test, and the fixtures they use.
__all__ = [name for name in list(globals()) if name.startswith("test_")] + ["clock", "open_shelf", "shelf"]
