"""Search text (README, "Search text"): Chinese, Japanese and Korean indexed as pairs of characters, two-letter terms,
spec 000's keywords() unchanged; the upgrade of existing databases on both backends, and erasure leaving no pair
behind. What users find on both backends is in the contract suite (memshelf.testing.contract)."""

from __future__ import annotations

import unicodedata

import psycopg
import pytest
from test_tables import _rows

import memshelf.stores._sqlite_fts as sqlite_fts
import memshelf.stores.postgres as pg_module
import memshelf.stores.sqlite as sqlite_module
from memshelf import Owner, Shelf
from memshelf.keywords import index_text, keywords, search_terms
from memshelf.stores._postgres_schema import MIGRATIONS as PG_MIGRATIONS
from memshelf.stores._sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from memshelf.stores.postgres import PostgresStore
from memshelf.stores.sqlite import sqlite3  # the store's own SQLite: its files need its FTS5

KALEB = Owner("home", "kaleb")
TOKYO = "東京の事務所は3階です"
FOLLOWER = "The meeting room is on the same floor."
SAMPLES = [TOKYO, "서울 사무실은 2층입니다", "我们的 AI 项目", "AI项目", "猫", "時々 ゲーム", "𠮷野家",
           "Zürich café 192.168.1.40", "", "tab\there\nand there", "東京\n大阪、京都。ソウル"]


@pytest.mark.parametrize("question, terms", [
    ("東京", ["東京"]),
    ("東京の事務所は何階ですか", ["東京", "京の", "の事", "事務", "務所", "所は", "は何", "何階", "階で"]),  # no です
    ("すし", ["すし"]),  # hiragana alone is kept when it is all there is
    ("서울 사무실은", ["서울", "사무", "무실", "실은"]),
    ("我们的 AI 项目", ["我们", "们的", "ai", "项目"]),
    ("What is my IP?", ["ip"]),
    ("Do I like Go?", ["like", "go"]),
    ("Is it in the IT room?", ["it", "room"]),  # "IT" in capitals, "it" not
    ("IS IT ON", []),  # capitals mean nothing in a line written all in capitals
    ("We've been to the UI review", ["been", "ui", "review"]),
    ("What did I say the printer's address was?", ["printer", "address"]),
])
def test_search_terms(question, terms):
    assert search_terms(question) == terms


def test_keywords_stay_spec_000():
    assert keywords("東京") == []
    assert keywords("What is my IP in Go?") == []
    assert keywords("What did I say the printer's address was?") == ["printer", "address"]


def test_index_text_pairs_cjk_runs_and_leaves_other_text_alone():
    assert index_text(TOKYO).split() == ["東京", "京の", "の事", "事務", "務所", "所は", "は", "3", "階で", "です",
                                         "す"]
    assert index_text("Zürich café 192.168.1.40") == "Zürich café 192.168.1.40"


def test_postgres_index_text_is_the_python_one(pg_url):
    with psycopg.connect(pg_url) as conn:
        assert [conn.execute("SELECT memshelf_index_text(%s)", (text,)).fetchone()[0] for text in SAMPLES] == \
            [index_text(text) for text in SAMPLES]


def _pairs_in_index(backend: str, target: str) -> int:
    """How many index entries of the tenant hold 東京, in the words and in the conversation context."""
    if backend == "sqlite":
        tables = _rows(backend, target, "SELECT words, context FROM fts_tenants WHERE tenant = ?", (KALEB.tenant,))[0]
        return sum(_rows(backend, target, f"SELECT count(*) FROM {t} WHERE {t} MATCH '\"東京\"'")[0][0] for t in tables)
    return _rows(backend, target, "SELECT count(*) FROM memories WHERE search @@ '東京'::tsquery"
                 " OR context_search @@ '東京'::tsquery")[0][0]


FOLDED_BLOCKS = [(0xC0, 0x24F), (0x1E00, 0x1EFF), (0x370, 0x3FF), (0x1F00, 0x1FFF), (0x400, 0x4FF), (0xFB00, 0xFB06),
                 (0xFF10, 0xFF5A)]
"""What sqlite_fts.fold covers: Latin letters, Greek, Cyrillic, Latin ligatures, full-width digits and letters."""
UNFOLDED = {"Ɵ", "Ƞ", "ɋ", "ẛ", "\u0374", "ͺ", "Ϳ", "ς", "ϓ", "ϔ", "ϲ"}
"""Where SQLite still indexes a letter otherwise than PostgreSQL: unaccent's own quirks (it folds "ƞ" but not "Ƞ",
keeps "ẛ" and final sigma, which FTS5's tokenizer folds itself), and symbols no one types as a word."""


def test_sqlite_indexes_letters_as_postgresql_does(pg_url):
    """Each letter of FOLDED_BLOCKS, before a "q", is the same word in SQLite's index (fold, then FTS5's tokenizer
    without the stemmer) as in PostgreSQL's (unaccent, lower case): so a question finds the same memories."""
    letters = [chr(point) for first, last in FOLDED_BLOCKS for point in range(first, last + 1)
               if unicodedata.category(chr(point))[0] in "LN"]
    with psycopg.connect(pg_url) as conn:
        postgres = [conn.execute("SELECT array_to_string(tsvector_to_array(to_tsvector('memshelf_text', %s)), ' ')",
                                 (letter + "q",)).fetchone()[0] for letter in letters]
    index = sqlite3.connect(":memory:")
    tokenizer = sqlite_fts.TOKENIZER.replace("porter ", "").replace("'", "''")
    index.execute(f"CREATE VIRTUAL TABLE words USING fts5(text, tokenize='{tokenizer}')")
    index.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, words, 'instance')")
    index.executemany("INSERT INTO words (rowid, text) VALUES (?, ?)",
                      [(row, sqlite_fts.fts_text(letter + "q")) for row, letter in enumerate(letters)])
    sqlite_words = dict.fromkeys(range(len(letters)), "")
    for row, term in index.execute("SELECT doc, term FROM temp.vocab ORDER BY doc, term"):
        sqlite_words[row] = f"{sqlite_words[row]} {term}".strip()
    differ = {letter for row, letter in enumerate(letters) if sqlite_words[row] != postgres[row]}
    assert len(letters) > 1_200 and "ß" in letters and "ά" in letters
    assert differ == UNFOLDED


MIXED_TEXT = [
    "The office printer is on 192.168.1.40 and the scanner on 10.0.0.5:8080.",
    "Email Kaleb at kaleb@example.com; the backup address is k.b@mail.example.org.",
    "The docs live at https://example.org/docs/page?id=3 and the wiki at wiki.example.net.",
    "My wi-fi password is tulip42 and the guest SSID is HomeNet_5G.",
    "I ran the half-marathon in 2:05:30 last spring; running keeps me calm.",
    "Kaleb's dog is named O'Brien and his cats are Miso and Tofu.",
    "We use PostgreSQL 18 with pgvector, and SQLite for the laptop.",
    "The weekly meeting moved to 3pm on Tuesdays, room 4B.",
    "Version v2.3.1 fixed bug #4411 in the C++ and C# clients.",
    "Tickets cost $45.99 each (VAT incl.), refunds within 14 days.",
    "Call +1-555-0100 after 5 p.m. or send an SMS.",
    "Our AWS account id is 1234-5678 and the bus to the office leaves at nine.",
    "She studies at the Universidade de São Paulo and visits Zürich in May.",
    "The file report_final-v3.pdf is on the NAS under /share/reports.",
    "Mom's birthday is 1985-04-12; Dad's is on 3 March.",
    "Use snake_case for Python names and camelCase in JavaScript.",
    "It was -5°C last night, so the heating organization called about the boiler.",
    "The kids, Ana, Ben and Cy, play football on Saturdays.",
    "Meet at Café Olé near the central station, table twelve.",
    "My car is a 2019 Toyota RAV4 hybrid with winter tyres.",
    "The ﬁnal invoice and the ﬂight details are in the travel folder.",
    "My ｉＰｈｏｎｅ backup is in the ＴＯＫＹＯ office drawer.",
    "Ο καφές είναι στο γραφείο, και το τσάι στην κουζίνα.",
    "Łukasz flies from Łódź to København on Friday; the Straße is closed.",
    "東京の事務所は3階です。",
    "서울 사무실은 2층입니다.",
    "राहुल दिल्ली में रहता है।",
    "Organizational changes: the organizers organize quarterly reviews.",
    "Happiness is generous; generosity happens when people are happy.",
    "He is a well-known, state-of-the-art researcher in e-learning.",
    "The password hint is 'blue-sky-42', not the cat's name.",
    "Buy eggs, milk & bread; the shopping list is on the fridge.",
    "The GPS tracker and the DNS server both need new batteries.",
    "I enjoy playing chess and played three games yesterday.",
    "They said the way to the cabin is through the woods.",
    "Ones and zeros: the binary clock shows 1010.",
]
"""Memories of many kinds of text: addresses, versions, acronyms, plurals, names with accents, other scripts."""
STEMMED_APART = {"may": "porter makes it `mai`, a prefix of \"mail\"", "ones": "porter makes it `on`, every \"on\""}
"""The terms of MIXED_TEXT that find other memories on SQLite than on PostgreSQL: their stemmers differ there."""


def test_both_backends_find_the_same_memories_for_each_word(tmp_path, pg_fresh_url):
    """Every search term of MIXED_TEXT, asked alone, finds the same memories on SQLite as on PostgreSQL (the order
    may differ: their bm25 statistics are the tenant's and the owner's), but for STEMMED_APART."""
    terms = sorted({term for line in MIXED_TEXT for term in search_terms(line)})
    found = {}
    for name, target in (("sqlite", str(tmp_path / "memory.db")), ("postgres", pg_fresh_url)):
        with Shelf.open(target, embedder=None) as shelf:
            stored = shelf.remember_many(KALEB, [{"topic": "notes", "content": line} for line in MIXED_TEXT])
            line_of = {memory.id: number for number, memory in enumerate(stored)}
            now = shelf.now()
            found[name] = {term: sorted(line_of[s.memory.id] for s in shelf.store.keyword_search(
                KALEB, [term], 1_000, now, by_confidence=True)) for term in terms}
    assert len(terms) > 200 and all(found["sqlite"][term] for term in terms)  # each term finds its own line
    assert {term for term in terms if found["sqlite"][term] != found["postgres"][term]} == set(STEMMED_APART)


def test_erasing_a_cjk_memory_leaves_its_pairs_nowhere(backend, target):
    with Shelf.open(target, embedder=None) as shelf:
        tokyo = shelf.remember(KALEB, "office", TOKYO)
        shelf.remember(KALEB, "office", FOLLOWER)  # its conversation context holds TOKYO
        assert _pairs_in_index(backend, target) == (3 if backend == "sqlite" else 2)
        shelf.forget(KALEB, tokyo.id)
        assert _pairs_in_index(backend, target) == 0
        assert [h.memory.content for h in shelf.search(KALEB, "東京 room")] == [FOLLOWER]


def test_sqlite_file_from_before_m010_is_reindexed(tmp_path, monkeypatch):
    """A file written by the previous version (CJK runs indexed whole) finds words inside runs once opened."""
    db = str(tmp_path / "memory.db")
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", [m for m in SQLITE_MIGRATIONS if m[0] != "m010_cjk_pairs"])
    monkeypatch.setattr(sqlite_fts, "index_text", lambda text: text)  # what the previous version indexed
    with Shelf.open(db, embedder=None) as shelf:
        shelf.remember(KALEB, "office", TOKYO)
        shelf.remember(KALEB, "office", FOLLOWER)
        assert list(shelf.search(KALEB, "事務所")) == []
    monkeypatch.undo()
    with Shelf.open(db, embedder=None) as shelf:
        assert "m010_cjk_pairs" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert [h.memory.content for h in shelf.search(KALEB, "事務所")] == [TOKYO]
        assert [s.memory.content for s in shelf.store.keyword_search(KALEB, ["東京", "room"], 5, shelf.now(),
                                                                     by_confidence=False)] == [FOLLOWER, TOKYO]
        assert [h.memory.content for h in shelf.search(KALEB, "printer room")] == [FOLLOWER]  # English as before
    assert _pairs_in_index("sqlite", db) == 3


def _tokens(db: str) -> set[str]:
    """The tokens the tenant's words table holds (FTS5's vocabulary of it)."""
    conn = sqlite3.connect(db)
    try:
        [(words,)] = conn.execute("SELECT words FROM fts_tenants WHERE tenant = ?", (KALEB.tenant,)).fetchall()
        conn.execute(f"CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, {words}, 'row')")
        return {row[0] for row in conn.execute("SELECT term FROM temp.vocab")}
    finally:
        conn.close()


def test_sqlite_file_from_before_m017_keeps_marks_in_words_once_opened(tmp_path, monkeypatch):
    """Tables made by the previous tokenizer (words cut at combining marks) are made again with it."""
    db = str(tmp_path / "memory.db")
    hindi = "राहुल दिल्ली में रहता है।"
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", [m for m in SQLITE_MIGRATIONS if m[0] != "m017_word_marks"])
    monkeypatch.setattr(sqlite_fts, "_TOKENIZE", "'porter unicode61 remove_diacritics 2'")
    with Shelf.open(db, embedder=None) as shelf:
        shelf.remember(KALEB, "travel", hindi)
        shelf.remember(KALEB, "office", TOKYO)
        shelf.remember(KALEB, "office", FOLLOWER)
        assert "राहुल" not in _tokens(db) and "र" in _tokens(db)  # cut at its vowel signs
    monkeypatch.undo()
    with Shelf.open(db, embedder=None) as shelf:
        assert "m017_word_marks" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert "राहुल" in _tokens(db) and "र" not in _tokens(db)
        assert [h.memory.content for h in shelf.search(KALEB, "राहुल")] == [hindi]
        assert [h.memory.content for h in shelf.search(KALEB, "事務所")] == [TOKYO]
        assert [h.memory.content for h in shelf.search(KALEB, "printer room")] == [FOLLOWER]  # English as before
        shelf.remember(KALEB, "travel", "Kaleb lives in Zürich.")  # the tables take new rows
        assert [h.memory.content for h in shelf.search(KALEB, "zurich")] == ["Kaleb lives in Zürich."]
    assert _pairs_in_index("sqlite", db) == 3


def test_sqlite_file_from_before_m020_folds_letters_once_opened(tmp_path, monkeypatch):
    """Tables filled before letters were folded are filled again, and find what a question folds."""
    db = str(tmp_path / "memory.db")
    straße, lodz = "The Straße is closed.", "Łukasz flies from Łódź."
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", [m for m in SQLITE_MIGRATIONS if m[0] != "m020_folded_letters"])
    monkeypatch.setattr(sqlite_fts, "fold", lambda text: text)  # what the previous version indexed and asked
    monkeypatch.setattr(sqlite_module, "fold", lambda text: text)
    with Shelf.open(db, embedder=None) as shelf:
        for content in (straße, lodz, TOKYO):
            shelf.remember(KALEB, "travel", content)
        assert list(shelf.search(KALEB, "strasse")) == [] and list(shelf.search(KALEB, "lodz")) == []
    monkeypatch.undo()
    with Shelf.open(db, embedder=None) as shelf:
        assert "m020_folded_letters" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert [h.memory.content for h in shelf.search(KALEB, "strasse")] == [straße]
        assert [h.memory.content for h in shelf.search(KALEB, "Straße")] == [straße]
        assert [h.memory.content for h in shelf.search(KALEB, "lodz lukasz")] == [lodz]
        assert [h.memory.content for h in shelf.search(KALEB, "事務所")] == [TOKYO]  # the rest as before
        shelf.forget(KALEB, shelf.search(KALEB, "lodz")[0].memory.id)  # its folded words leave the index
        assert list(shelf.search(KALEB, "lodz")) == [] and "lodz" not in _tokens(db) and "łodz" not in _tokens(db)


BEFORE_M014 = ("m014_word_marks", "m015_memory_words", "m016_admin_policy_for_admin_only")
"""An older database is made by leaving out these migrations (and the ones after them that rely on the search column
as they remake it, or on memory_words); the columns of the others are what the code reads."""
BEFORE_M011 = ("m011_cjk_pairs", *BEFORE_M014)


def test_postgres_database_from_before_m011_is_reindexed(pg_server, monkeypatch):
    url = pg_server.empty_database()
    monkeypatch.setattr(pg_module, "MIGRATIONS", [m for m in PG_MIGRATIONS if m[0] not in BEFORE_M011])
    with Shelf(PostgresStore(url), embedder=None) as shelf:
        shelf.remember(KALEB, "office", TOKYO)
        shelf.remember(KALEB, "office", FOLLOWER)
    assert _pairs_in_index("postgres", url) == 0
    monkeypatch.undo()
    with Shelf(PostgresStore(url), embedder=None) as shelf:
        assert "m011_cjk_pairs" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert [h.memory.content for h in shelf.search(KALEB, "事務所")] == [TOKYO]
        assert [s.memory.content for s in shelf.store.keyword_search(KALEB, ["東京", "room"], 5, shelf.now(),
                                                                     by_confidence=False)] == [FOLLOWER, TOKYO]
        assert [h.memory.content for h in shelf.search(KALEB, "printer room")] == [FOLLOWER]
    assert _pairs_in_index("postgres", url) == 2


def test_postgres_database_from_before_m014_keeps_marks_in_words_once_opened(pg_server, monkeypatch):
    url = pg_server.empty_database()
    tamil, nfd = "அவர் சென்னையில் வசிக்கிறார்.", "Kaleb lives in Zu\u0308rich."
    monkeypatch.setattr(pg_module, "MIGRATIONS", [m for m in PG_MIGRATIONS if m[0] not in BEFORE_M014])
    with Shelf(PostgresStore(url), embedder=None) as shelf:
        for text in (tamil, nfd, FOLLOWER):
            shelf.remember(KALEB, "travel", text)
    found = "SELECT count(*) FROM memories WHERE search @@ to_tsquery('memshelf_text', %s)"
    assert _rows("postgres", url, found, ("'சென்னையில்'",)) == _rows("postgres", url, found, ("'zurich'",)) == [(0,)]
    monkeypatch.undo()
    with Shelf(PostgresStore(url), embedder=None) as shelf:
        assert "m014_word_marks" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert [h.memory.content for h in shelf.search(KALEB, "சென்னையில்")] == [tamil]
        assert [h.memory.content for h in shelf.search(KALEB, "Zürich")] == [nfd]
        assert [h.memory.content for h in shelf.search(KALEB, "printer room")] == [FOLLOWER]  # English as before
    # the conversation context of the turn after the Tamil one was rewritten with its words whole
    assert _rows("postgres", url, "SELECT context_search @@ to_tsquery('memshelf_text', %s) FROM memories"
                 " WHERE content = %s", ("'சென்னையில்'", nfd)) == [(True,)]
