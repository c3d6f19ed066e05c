"""The examples of the spec chapters (../shared/spec), as acceptance tests: same inputs, same outputs."""

from __future__ import annotations

from memshelf import Owner, keywords

KALEB = Owner("home", "kaleb")
PERSONA = "You are GLaDOS. Be sardonic and brief."
QUESTION = "What did I say the printer's address was?"


def printer_story(shelf, clock, *, with_guess=True):
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    clock.advance(1)
    if with_guess:
        shelf.remember(KALEB, "network", "The printer might be on the guest network.", source="inferred")
        clock.advance(1)
    shelf.remember(KALEB, "network", "The printer jams on thick paper.", source="mined")
    clock.advance(1)


def test_sources_set_confidence(shelf, clock):
    printer_story(shelf, clock)
    rows = {(m.memory.topic, m.memory.source, m.memory.confidence) for m in shelf.search(KALEB, "printer")}
    assert rows == {("network", "stated", 1.0), ("network", "inferred", 0.4), ("network", "mined", 0.6)}


def test_search_orders_by_confidence(shelf, clock):
    printer_story(shelf, clock)
    hits = shelf.search(KALEB, "printer")
    lines = [f"{h.memory.confidence:.1f}  [{h.memory.topic}] {h.memory.content}" for h in hits]
    assert lines == [
        "1.0  [network] The office printer is on 192.168.1.40.",
        "0.6  [network] The printer jams on thick paper.",
        "0.4  [network] The printer might be on the guest network.",
    ]


def test_keywords_examples():
    assert keywords("What did I say the printer's address was?") == ["printer", "address"]
    assert keywords("Tell me about Whisper.") == ["whisper"]


def test_context_block(shelf, clock):
    printer_story(shelf, clock)
    assert shelf.context(KALEB, QUESTION) == (
        "Relevant knowledge (confidence in brackets, 1.0 means the user said so):\n"
        "  - [1.0] The office printer is on 192.168.1.40.\n"
        "  - [0.6] The printer jams on thick paper.\n"
        "  - [0.4] The printer might be on the guest network."
    )


def test_context_is_empty_string_on_no_hits(shelf, clock):
    printer_story(shelf, clock)
    assert shelf.context(KALEB, "How was your day?") == ""


def test_build_prompt_layout(shelf, clock):
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    clock.advance(1)
    shelf.set_fact(KALEB, "favorite_language", "Python")
    printer_story(shelf, clock, with_guess=False)
    assert shelf.build_prompt(PERSONA, KALEB, QUESTION) == (
        "You are GLaDOS. Be sardonic and brief.\n"
        "\n"
        "Memory context:\n"
        "Known facts about the user:\n"
        "  - favorite_language: Python\n"
        "  - user_name: Kaleb\n"
        "\n"
        "Relevant knowledge (confidence in brackets, 1.0 means the user said so):\n"
        "  - [1.0] The office printer is on 192.168.1.40.\n"
        "  - [0.6] The printer jams on thick paper."
    )


def test_build_prompt_without_hits_or_facts_is_the_base_prompt(shelf, clock):
    printer_story(shelf, clock)
    assert shelf.build_prompt(PERSONA, KALEB, "How was your day?") == PERSONA


def test_build_prompt_keeps_facts_when_nothing_matches(shelf, clock):
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    assert shelf.build_prompt(PERSONA, KALEB, "How was your day?") == (
        PERSONA + "\n\nMemory context:\nKnown facts about the user:\n  - user_name: Kaleb"
    )


def test_build_prompt_without_a_base_prompt_starts_with_the_memory_block(shelf, clock):
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    printer_story(shelf, clock, with_guess=False)
    for base in ("", "  \n"):
        prompt = shelf.build_prompt(base, KALEB, QUESTION)
        assert prompt.startswith("Memory context:\nKnown facts about the user:\n  - user_name: Kaleb\n\nRelevant")
    assert shelf.build_prompt("", KALEB, "How was your day?") == (
        "Memory context:\nKnown facts about the user:\n  - user_name: Kaleb")
    assert shelf.build_prompt("", Owner("home", "nobody"), QUESTION) == ""


def test_owner_filter_denial_evidence(shelf):
    """Spec 001: positive evidence for the owner, denial evidence for another tenant."""
    maya = Owner("acme", "maya")
    shelf.remember(maya, "preferences", "Maya prefers email summaries", source="stated")
    assert [h.memory.content for h in shelf.search(maya, "email summaries")] == ["Maya prefers email summaries"]
    assert list(shelf.search(Owner("other-tenant", "maya"), "email summaries")) == []
