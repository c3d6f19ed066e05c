"""SQLite migrations: named, append-only, each applied once in its own transaction and recorded."""

from __future__ import annotations

WHITESPACE_DIGESTS = "m006_whitespace_digests"
"""The migration after whose SQL stores/sqlite.py recomputes every digest (stores.base.digest), in Python."""

CHANGES_KEPT = 4_096
"""How many of an owner's latest entries owner_changes keeps (m013): a cached matrix further behind is rebuilt."""


_VECTOR_CHANGED = "old.embedding IS NOT new.embedding OR old.embed_model IS NOT new.embed_model"


def _logged(row: str, kind: str) -> str:
    """A generation trigger's entry in owner_changes (m013): the key of `row` (old or new) with `kind`, then the
    owner's entries more than CHANGES_KEPT generations old dropped."""
    owner = f"tenant = {row}.tenant AND user_id = {row}.user_id"
    return (f"    INSERT INTO owner_changes (tenant, user_id, generation, pk, kind)\n"
            f"    SELECT tenant, user_id, generation, {row}.pk, {kind} FROM owner_generation WHERE {owner};\n"
            f"    DELETE FROM owner_changes WHERE {owner} AND generation <=\n"
            f"        (SELECT generation FROM owner_generation WHERE {owner}) - {CHANGES_KEPT};")

CJK_INDEX = "m010_cjk_pairs"
"""The migration after whose SQL stores/sqlite.py rebuilds every tenant's full-text tables from its rows."""
WORD_MARKS = "m017_word_marks"
"""The migration after whose SQL every tenant's full-text tables are made again with marks kept in words
(stores/_sqlite_fts.py, TOKENIZER)."""

FOLDED_LETTERS = "m020_folded_letters"
"""The migration after whose SQL every tenant's full-text tables are filled again with letters folded
(stores/_sqlite_fts.py, fold)."""

MIGRATIONS: list[tuple[str, str]] = [
    ("m001_initial", """
CREATE TABLE memories (
    pk           INTEGER PRIMARY KEY,
    id           TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    topic        TEXT NOT NULL,
    content      TEXT NOT NULL,
    digest       TEXT NOT NULL,
    owner_tag    TEXT NOT NULL,
    source       TEXT NOT NULL,
    confidence   REAL NOT NULL,
    created_at   TEXT NOT NULL,
    last_seen    TEXT NOT NULL,
    observations INTEGER NOT NULL DEFAULT 1,
    expires_at   TEXT,
    embedding    BLOB,
    embed_model  TEXT,
    UNIQUE (tenant, user_id, id),
    UNIQUE (tenant, user_id, digest)
);
CREATE INDEX memories_owner_created ON memories (tenant, user_id, created_at);
CREATE INDEX memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memories_model ON memories (embed_model, pk);

-- Full-text index over topic and content. External content: the text lives once, in memories. owner_tag is one
-- token per owner, so a match starts from the owner's rows instead of every tenant's (the SQL owner filter stays).
CREATE VIRTUAL TABLE memories_fts USING fts5(
    topic, content, owner_tag, content='memories', content_rowid='pk',
    tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, topic, content, owner_tag) VALUES (new.pk, new.topic, new.content, new.owner_tag);
END;
CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, topic, content, owner_tag)
    VALUES ('delete', old.pk, old.topic, old.content, old.owner_tag);
END;

-- Per-owner counters that tell the in-process vector matrix when to refresh, so several processes can share one
-- file: `appended` moves on every insert (the matrix fetches just the new rows), `generation` on anything else
-- that changes what vector search may return (the matrix is rebuilt).
CREATE TABLE owner_generation (
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    appended   INTEGER NOT NULL DEFAULT 0,
    memories   INTEGER NOT NULL DEFAULT 0,  -- how many rows the owner has (chooses the keyword query plan)
    PRIMARY KEY (tenant, user_id)
) WITHOUT ROWID;
CREATE INDEX memories_owner_model ON memories (tenant, user_id, embed_model, pk);
CREATE TRIGGER memories_gen_insert AFTER INSERT ON memories BEGIN
    INSERT INTO owner_generation (tenant, user_id, appended, memories) VALUES (new.tenant, new.user_id, 1, 1)
    ON CONFLICT (tenant, user_id) DO UPDATE SET appended = appended + 1, memories = memories + 1;
END;
CREATE TRIGGER memories_gen_delete AFTER DELETE ON memories BEGIN
    UPDATE owner_generation SET generation = generation + 1, memories = memories - 1
    WHERE tenant = old.tenant AND user_id = old.user_id;
END;
CREATE TRIGGER memories_gen_update AFTER UPDATE OF embedding, embed_model, expires_at, confidence ON memories
WHEN old.embedding IS NOT new.embedding OR old.embed_model IS NOT new.embed_model
     OR old.expires_at IS NOT new.expires_at OR old.confidence IS NOT new.confidence
BEGIN
    UPDATE owner_generation SET generation = generation + 1
    WHERE tenant = new.tenant AND user_id = new.user_id;
END;

CREATE TABLE facts (
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    source     TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, user_id, key)
);
CREATE TABLE fact_history (
    pk      INTEGER PRIMARY KEY,
    tenant  TEXT NOT NULL,
    user_id TEXT NOT NULL,
    key     TEXT NOT NULL,
    value   TEXT NOT NULL,
    source  TEXT NOT NULL,
    set_at  TEXT NOT NULL
);
CREATE INDEX fact_history_owner ON fact_history (tenant, user_id, key, pk);

CREATE TABLE messages (
    pk         INTEGER PRIMARY KEY,
    id         TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    thread     TEXT NOT NULL,
    role       TEXT NOT NULL,
    content    TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    UNIQUE (tenant, user_id, id)
);
CREATE INDEX messages_thread ON messages (tenant, user_id, thread, pk);
CREATE INDEX messages_expiry ON messages (expires_at) WHERE expires_at IS NOT NULL;
"""),
    ("m002_api_keys", """
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant      TEXT,
    name        TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL,
    revoked_at  TEXT
);
"""),
    ("m003_conversation_context", """
-- Conversation context: a second full-text index in which each memory also carries the text of the
-- CONTEXT_TURNS (2) memories stored just before it by the same owner under the same topic. Only the hybrid search
-- ranks with it (and only returns rows whose own words match); keyword search keeps using memories_fts, so its
-- order stays confidence, then the row's own match, then newest. stores/sqlite.py fills memories.context at insert
-- time and rewrites it when one of those neighbours is deleted, so no copy of erased text stays behind.
ALTER TABLE memories ADD COLUMN context TEXT NOT NULL DEFAULT '';
CREATE INDEX memories_owner_topic ON memories (tenant, user_id, topic, pk);
UPDATE memories SET context = coalesce((
    SELECT group_concat(content, char(10)) FROM (
        SELECT p.content FROM memories p
        WHERE p.tenant = memories.tenant AND p.user_id = memories.user_id AND p.topic = memories.topic
          AND p.pk < memories.pk
        ORDER BY p.pk DESC LIMIT 2)), '');
CREATE VIRTUAL TABLE memories_context_fts USING fts5(
    topic, content, owner_tag, context, content='memories', content_rowid='pk',
    tokenize='porter unicode61 remove_diacritics 2'
);
INSERT INTO memories_context_fts (memories_context_fts) VALUES ('rebuild');
CREATE TRIGGER memories_context_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_context_fts (rowid, topic, content, owner_tag, context)
    VALUES (new.pk, new.topic, new.content, new.owner_tag, new.context);
END;
CREATE TRIGGER memories_context_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_context_fts (memories_context_fts, rowid, topic, content, owner_tag, context)
    VALUES ('delete', old.pk, old.topic, old.content, old.owner_tag, old.context);
END;
CREATE TRIGGER memories_context_fts_update AFTER UPDATE OF context ON memories BEGIN
    INSERT INTO memories_context_fts (memories_context_fts, rowid, topic, content, owner_tag, context)
    VALUES ('delete', old.pk, old.topic, old.content, old.owner_tag, old.context);
    INSERT INTO memories_context_fts (rowid, topic, content, owner_tag, context)
    VALUES (new.pk, new.topic, new.content, new.owner_tag, new.context);
END;
"""),
    ("m004_fts_per_tenant", """
-- Full-text indexes move to one pair of tables per tenant (stores/sqlite_fts.py): bm25's statistics then come from
-- that tenant's memories alone, so no tenant's scores or order depend on another tenant's words. Tables are
-- created on a tenant's first write; a tenant's existing rows are indexed then.
DROP TRIGGER memories_fts_insert;
DROP TRIGGER memories_fts_delete;
DROP TABLE memories_fts;
DROP TRIGGER memories_context_fts_insert;
DROP TRIGGER memories_context_fts_delete;
DROP TRIGGER memories_context_fts_update;
DROP TABLE memories_context_fts;
CREATE TABLE fts_tenants (
    tenant  TEXT PRIMARY KEY,
    words   TEXT NOT NULL,
    context TEXT NOT NULL
);
"""),
    ("m005_fts_reindex", """
-- Each tenant's full-text tables are rebuilt from its rows (stores/sqlite.py runs it after this script): before
-- this version a tenant's first memory was indexed twice (bm25 counted it twice), and every erasure's full merge
-- added levels to the index until FTS5 read it as corrupt. merges counts the full merges since the last rebuild,
-- so that a rebuild comes before too many of them (stores/sqlite_fts.py, REBUILD_EVERY).
ALTER TABLE fts_tenants ADD COLUMN merges INTEGER NOT NULL DEFAULT 0;
"""),
    (WHITESPACE_DIGESTS, """
-- Dedup ignores surrounding whitespace and runs of whitespace (stores.base.digest): every digest is recomputed
-- after this script, oldest row first. If two existing rows of an owner now share a digest, the older one takes it
-- and the newer keeps its old digest: both stay as they are (nothing merged), and a new repeat counts on the older.
SELECT 1;
"""),
    ("m007_message_pages_by_time", """
-- Pages of messages are ordered newest first by (created_at, row key), with opaque cursors naming the last
-- record's instant and id (Shelf.list_messages); these keep that order an index walk.
CREATE INDEX messages_owner_created ON messages (tenant, user_id, created_at);
CREATE INDEX messages_thread_created ON messages (tenant, user_id, thread, created_at);
"""),
    ("m008_learning", """
-- Learning from conversations (learning/_decide.py). learn_marks: the watermark per (owner, thread), the last
-- message learned; learned_from: the messages each learned memory (its id) or fact (its key) came from, which
-- forget_thread(cascade=True) follows. A superseded memory keeps its row and text, closed at superseded_at by the
-- memory superseded_by; searches skip it unless asked for the past (View). Closing one changes what vector search
-- may return, so it moves the owner's generation like any other such change.
CREATE TABLE learn_marks (
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    thread     TEXT NOT NULL,
    message_id TEXT NOT NULL,
    said_at    TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, user_id, thread)
);
CREATE TABLE learned_from (
    pk         INTEGER PRIMARY KEY,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('memory', 'fact')),
    record     TEXT NOT NULL,
    message_id TEXT NOT NULL,
    thread     TEXT,
    said_at    TEXT
);
CREATE INDEX learned_from_record ON learned_from (tenant, user_id, kind, record);
CREATE INDEX learned_from_thread ON learned_from (tenant, user_id, thread);
ALTER TABLE memories ADD COLUMN superseded_at TEXT;
ALTER TABLE memories ADD COLUMN superseded_by TEXT;
CREATE TRIGGER memories_gen_supersede AFTER UPDATE OF superseded_at ON memories
WHEN old.superseded_at IS NOT new.superseded_at
BEGIN
    UPDATE owner_generation SET generation = generation + 1
    WHERE tenant = new.tenant AND user_id = new.user_id;
END;
"""),
    ("m009_memory_pieces", """
-- A memory longer than the embedding model's window is embedded in overlapping pieces (README, "Long memories").
-- The row keeps its first piece's vector, so a memory in one piece (most are) costs nothing more; this table keeps
-- the later pieces' vectors, stamped with the row's model. Pieces go with their memory (ON DELETE CASCADE: forget,
-- purge, erasure), and change only with the row's vector, whose triggers already move the owner's counters.
CREATE TABLE memory_pieces (
    memory_pk   INTEGER NOT NULL REFERENCES memories (pk) ON DELETE CASCADE,
    piece       INTEGER NOT NULL,  -- 1, 2, ...: piece 0 is the row's own vector
    tenant      TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    embed_model TEXT NOT NULL,
    embedding   BLOB NOT NULL,
    PRIMARY KEY (memory_pk, piece)
) WITHOUT ROWID;
CREATE INDEX memory_pieces_owner ON memory_pieces (tenant, user_id, embed_model, memory_pk);
"""),
    (CJK_INDEX, """
-- Chinese, Japanese and Korean text is indexed as overlapping pairs of characters (keywords.index_text; README,
-- "Search text"), so that a word is found inside a run with no spaces. Every tenant's full-text tables are rebuilt
-- from its rows after this script (stores/sqlite.py); text without CJK is indexed exactly as before.
SELECT 1;
"""),
    ("m011_confirmed", """
-- A mined or inferred memory the user vouched for becomes stated (Shelf.confirm); the row records when, and the
-- source it had, so the record shows it was confirmed rather than said.
ALTER TABLE memories ADD COLUMN confirmed_at TEXT;
ALTER TABLE memories ADD COLUMN confirmed_from TEXT;
"""),
    ("m012_count_inserts_per_batch", """
-- New rows are counted in owner_generation once per batch by the store (SQLiteStore._count_added), not by a
-- trigger per row: a trigger makes every INSERT open a statement savepoint, and each savepoint made FTS5 write
-- out the index entries it held in memory, one small segment per row (BENCHMARKS.md, "Ingest").
DROP TRIGGER IF EXISTS memories_gen_insert;
"""),
    ("m013_owner_changes", f"""
-- Which row each move of an owner's generation was about, so a cached vector matrix catches up by re-reading those
-- rows instead of every vector (SQLiteStore._caught_up). kind: 0 the row's confidence, expiry or supersession
-- changed, 1 its vector or model changed, 2 it was deleted. One entry per generation; entries more than
-- CHANGES_KEPT generations old are dropped as new ones come, and a matrix further behind is rebuilt.
-- Keys only: no text or vector of a memory is kept here, and the owner's entries go with the owner's erasure.
CREATE TABLE owner_changes (
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    generation INTEGER NOT NULL,
    pk         INTEGER NOT NULL,
    kind       INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id, generation)
) WITHOUT ROWID;
DROP TRIGGER memories_gen_delete;
DROP TRIGGER memories_gen_update;
DROP TRIGGER memories_gen_supersede;
CREATE TRIGGER memories_gen_delete AFTER DELETE ON memories BEGIN
    UPDATE owner_generation SET generation = generation + 1, memories = memories - 1
    WHERE tenant = old.tenant AND user_id = old.user_id;
{_logged('old', '2')}
END;
CREATE TRIGGER memories_gen_update AFTER UPDATE OF embedding, embed_model, expires_at, confidence ON memories
WHEN old.embedding IS NOT new.embedding OR old.embed_model IS NOT new.embed_model
     OR old.expires_at IS NOT new.expires_at OR old.confidence IS NOT new.confidence
BEGIN
    UPDATE owner_generation SET generation = generation + 1
    WHERE tenant = new.tenant AND user_id = new.user_id;
{_logged('new', _VECTOR_CHANGED)}
END;
CREATE TRIGGER memories_gen_supersede AFTER UPDATE OF superseded_at ON memories
WHEN old.superseded_at IS NOT new.superseded_at
BEGIN
    UPDATE owner_generation SET generation = generation + 1
    WHERE tenant = new.tenant AND user_id = new.user_id;
{_logged('new', '0')}
END;
"""),
    ("m014_fts_secure_delete", """
-- secure: the tenant's full-text tables take a deleted row's entries out in place (FTS5's secure-delete), so an
-- erasure need not merge the whole index (stores/_sqlite_fts.py, SECURE_DELETE). Existing tables start without it
-- and get it after their next full merge, on an SQLite that has it.
ALTER TABLE fts_tenants ADD COLUMN secure INTEGER NOT NULL DEFAULT 0;
"""),
    ("m015_tenant_rows", """
-- rows: how many memories the tenant has, which a keyword search reads to choose its plan. Summing owner_generation
-- over the tenant cost 0.6 ms at 10,000 users and 7 ms at 100,000, on every search; these triggers keep the total.
-- (An upsert's DO UPDATE fires the update trigger.)
ALTER TABLE fts_tenants ADD COLUMN rows INTEGER NOT NULL DEFAULT 0;
UPDATE fts_tenants SET rows = (SELECT coalesce(sum(g.memories), 0) FROM owner_generation g
                               WHERE g.tenant = fts_tenants.tenant);
CREATE TRIGGER owner_generation_rows_insert AFTER INSERT ON owner_generation WHEN new.memories != 0 BEGIN
    UPDATE fts_tenants SET rows = rows + new.memories WHERE tenant = new.tenant;
END;
CREATE TRIGGER owner_generation_rows_update AFTER UPDATE OF memories ON owner_generation
WHEN new.memories != old.memories BEGIN
    UPDATE fts_tenants SET rows = rows + new.memories - old.memories WHERE tenant = new.tenant;
END;
CREATE TRIGGER owner_generation_rows_delete AFTER DELETE ON owner_generation WHEN old.memories != 0 BEGIN
    UPDATE fts_tenants SET rows = rows - old.memories WHERE tenant = old.tenant;
END;
"""),
    ("m016_most_confident", """
-- most_confident: the highest confidence any of the owner's memories has had (a deletion does not lower it). When a
-- keyword search's last hit is that confident, no older match can outrank it, so an owner whose memories are all
-- learned is answered from a common word's newest matches as an owner of statements is (SQLiteStore.keyword_search).
-- New rows raise it once per batch (SQLiteStore._count_added); a confirmation or a new observation, this trigger.
ALTER TABLE owner_generation ADD COLUMN most_confident REAL;
UPDATE owner_generation SET most_confident = (SELECT max(m.confidence) FROM memories m
                                              WHERE m.tenant = owner_generation.tenant
                                                AND m.user_id = owner_generation.user_id);
CREATE TRIGGER memories_most_confident AFTER UPDATE OF confidence ON memories WHEN new.confidence > old.confidence
BEGIN
    UPDATE owner_generation SET most_confident = max(coalesce(most_confident, new.confidence), new.confidence)
    WHERE tenant = new.tenant AND user_id = new.user_id;
END;
"""),
    (WORD_MARKS, """
-- Words keep their combining marks (Devanagari and Tamil vowel signs, Hebrew points, a decomposed diaeresis), as
-- PostgreSQL's parser and keywords.words() keep them: every tenant's full-text tables are made again with the new
-- tokenizer and filled from its rows after this script (stores/sqlite.py). Text without marks is indexed as before.
SELECT 1;
"""),
    ("m018_evidence_set_at", """
-- A fact's evidence names the value it taught: the set_at of the history row learning wrote (stores.base.Evidence),
-- so forgetting a thread with cascade takes that value and leaves one the caller set. Older rows have none.
ALTER TABLE learned_from ADD COLUMN set_at TEXT;
"""),
    ("m019_superseded", """
-- The owner's superseded memories: erasing a memory finds those it had closed through this (they take its place,
-- stores/sql_records.py _hand_back_places) without reading every row of the owner. PostgreSQL has had it since m008.
CREATE INDEX memories_superseded ON memories (tenant, user_id) WHERE superseded_at IS NOT NULL;
"""),
    (FOLDED_LETTERS, """
-- Letters are indexed folded as PostgreSQL's unaccent folds them (full-width forms, ligatures, Greek accents, "ø",
-- "ł", "ß": stores/_sqlite_fts.py, fold), and questions are folded alike: every tenant's full-text tables are
-- rebuilt from its rows after this script (stores/sqlite.py). Text without such letters is indexed as before.
SELECT 1;
"""),
]
