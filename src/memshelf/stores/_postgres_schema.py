"""PostgreSQL migrations: named, append-only, each applied once in its own transaction and recorded in
memshelf_migrations. PostgresStore takes pg_advisory_xact_lock(MIGRATION_LOCK) first, so two processes
migrating the same database at once apply each migration exactly once.

Text search: a configuration `memshelf_text` that strips accents (unaccent) and stems English words with the
snowball stemmer but keeps every word (no stopword list), like SQLite's `porter unicode61 remove_diacritics 2`.
Before parsing, every run of characters that are not letters or digits becomes a space, so `192.168.1.40` is
four words and `foo_bar` two, as in FTS5; PostgreSQL's parser alone would keep hosts and versions whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from .tables import walled_tables

WHITESPACE_DIGESTS = "m007_whitespace_digests"
"""The migration after whose SQL stores/postgres.py recomputes every digest (stores.base.digest), in Python."""

MIGRATION_LOCK = 7_406_931_214_886_052_101
"""Key of the advisory lock held while migrating (any constant unlikely to collide with an application's)."""

APP_ROLE = "memshelf_app"
"""The role every owner-scoped transaction runs as: not superuser, no BYPASSRLS, so row-level security applies."""

ADMIN_ROLE = "memshelf_admin"
"""The role admin transactions run as (backfill, purge, owners, API keys): a policy lets it see every tenant."""

DERIVED_TABLES = ("memory_words",)
"""Owner tables PostgreSQL keeps from `memories` (m015), outside the registry (tables.py) but walled like it."""
OWNER_TABLES = (*walled_tables(), *DERIVED_TABLES)
"""Every table walled with row-level security (the registry's and the derived ones): what the tests check, table by
table."""

_FIRST_WALLED = ("memories", "facts", "fact_history", "messages", "api_keys")
"""The owner tables of m001, frozen: m002, m005 and m006 say what they did to these and only these, whatever the
registry lists later (an applied migration never changes). A table added later is walled by its own migration,
with tenant_wall()."""

_TENANT_WALL = "\n".join(f"""
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
CREATE POLICY memshelf_tenant ON {table}
    USING (tenant = current_setting('memshelf.tenant', true))
    WITH CHECK (tenant = current_setting('memshelf.tenant', true));
CREATE POLICY memshelf_admin ON {table} TO {ADMIN_ROLE} USING (true) WITH CHECK (true);
GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP_ROLE}, {ADMIN_ROLE};
""" for table in _FIRST_WALLED)

_ADMIN_ONLY_AS_ADMIN = "\n".join(f"""
ALTER POLICY memshelf_tenant ON {table}
    USING (tenant = nullif(current_setting('memshelf.tenant', true), ''))
    WITH CHECK (tenant = nullif(current_setting('memshelf.tenant', true), ''));
ALTER POLICY memshelf_admin ON {table}
    USING (current_user = '{ADMIN_ROLE}') WITH CHECK (current_user = '{ADMIN_ROLE}');
""" for table in _FIRST_WALLED)


_CJK = (r"[\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
        r"\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]")
"""keywords._CJK as a regular expression of PostgreSQL, frozen with m011: a change to either needs a migration
that reindexes, on both backends."""


_MARKS = (
    r"\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u05bf\u05c1-\u05c2\u05c4-\u05c5\u05c7\u0610-\u061a"
    r"\u064b-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7-\u06e8\u06ea-\u06ed\u0711\u0730-\u074a"
    r"\u07a6-\u07b0\u07eb-\u07f3\u07fd\u0816-\u0819\u081b-\u0823\u0825-\u0827\u0829-\u082d\u0859-\u085b"
    r"\u0898-\u089f\u08ca-\u08e1\u08e3-\u0903\u093a-\u093c\u093e-\u094f\u0951-\u0957\u0962-\u0963"
    r"\u0981-\u0983\u09bc\u09be-\u09c4\u09c7-\u09c8\u09cb-\u09cd\u09d7\u09e2-\u09e3\u09fe\u0a01-\u0a03"
    r"\u0a3c\u0a3e-\u0a42\u0a47-\u0a48\u0a4b-\u0a4d\u0a51\u0a70-\u0a71\u0a75\u0a81-\u0a83\u0abc"
    r"\u0abe-\u0ac5\u0ac7-\u0ac9\u0acb-\u0acd\u0ae2-\u0ae3\u0afa-\u0aff\u0b01-\u0b03\u0b3c\u0b3e-\u0b44"
    r"\u0b47-\u0b48\u0b4b-\u0b4d\u0b55-\u0b57\u0b62-\u0b63\u0b82\u0bbe-\u0bc2\u0bc6-\u0bc8\u0bca-\u0bcd"
    r"\u0bd7\u0c00-\u0c04\u0c3c\u0c3e-\u0c44\u0c46-\u0c48\u0c4a-\u0c4d\u0c55-\u0c56\u0c62-\u0c63"
    r"\u0c81-\u0c83\u0cbc\u0cbe-\u0cc4\u0cc6-\u0cc8\u0cca-\u0ccd\u0cd5-\u0cd6\u0ce2-\u0ce3\u0d00-\u0d03"
    r"\u0d3b-\u0d3c\u0d3e-\u0d44\u0d46-\u0d48\u0d4a-\u0d4d\u0d57\u0d62-\u0d63\u0d81-\u0d83\u0dca"
    r"\u0dcf-\u0dd4\u0dd6\u0dd8-\u0ddf\u0df2-\u0df3\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc"
    r"\u0ec8-\u0ecd\u0f18-\u0f19\u0f35\u0f37\u0f39\u0f3e-\u0f3f\u0f71-\u0f84\u0f86-\u0f87\u0f8d-\u0f97"
    r"\u0f99-\u0fbc\u0fc6\u102b-\u103e\u1056-\u1059\u105e-\u1060\u1062-\u1064\u1067-\u106d\u1071-\u1074"
    r"\u1082-\u108d\u108f\u109a-\u109d\u135d-\u135f\u1712-\u1715\u1732-\u1734\u1752-\u1753\u1772-\u1773"
    r"\u17b4-\u17d3\u17dd\u180b-\u180d\u180f\u1885-\u1886\u18a9\u1920-\u192b\u1930-\u193b\u1a17-\u1a1b"
    r"\u1a55-\u1a5e\u1a60-\u1a7c\u1a7f\u1ab0-\u1ace\u1b00-\u1b04\u1b34-\u1b44\u1b6b-\u1b73\u1b80-\u1b82"
    r"\u1ba1-\u1bad\u1be6-\u1bf3\u1c24-\u1c37\u1cd0-\u1cd2\u1cd4-\u1ce8\u1ced\u1cf4\u1cf7-\u1cf9"
    r"\u1dc0-\u1dff\u20d0-\u20f0\u2cef-\u2cf1\u2d7f\u2de0-\u2dff\u302a-\u302f\u3099-\u309a\ua66f-\ua672"
    r"\ua674-\ua67d\ua69e-\ua69f\ua6f0-\ua6f1\ua802\ua806\ua80b\ua823-\ua827\ua82c\ua880-\ua881"
    r"\ua8b4-\ua8c5\ua8e0-\ua8f1\ua8ff\ua926-\ua92d\ua947-\ua953\ua980-\ua983\ua9b3-\ua9c0\ua9e5"
    r"\uaa29-\uaa36\uaa43\uaa4c-\uaa4d\uaa7b-\uaa7d\uaab0\uaab2-\uaab4\uaab7-\uaab8\uaabe-\uaabf\uaac1"
    r"\uaaeb-\uaaef\uaaf5-\uaaf6\uabe3-\uabea\uabec-\uabed\ufb1e\ufe00-\ufe0f\ufe20-\ufe2f\U000101fd"
    r"\U000102e0\U00010376-\U0001037a\U00010a01-\U00010a03\U00010a05-\U00010a06\U00010a0c-\U00010a0f"
    r"\U00010a38-\U00010a3a\U00010a3f\U00010ae5-\U00010ae6\U00010d24-\U00010d27\U00010eab-\U00010eac"
    r"\U00010f46-\U00010f50\U00010f82-\U00010f85\U00011000-\U00011002\U00011038-\U00011046\U00011070"
    r"\U00011073-\U00011074\U0001107f-\U00011082\U000110b0-\U000110ba\U000110c2\U00011100-\U00011102"
    r"\U00011127-\U00011134\U00011145-\U00011146\U00011173\U00011180-\U00011182\U000111b3-\U000111c0"
    r"\U000111c9-\U000111cc\U000111ce-\U000111cf\U0001122c-\U00011237\U0001123e\U000112df-\U000112ea"
    r"\U00011300-\U00011303\U0001133b-\U0001133c\U0001133e-\U00011344\U00011347-\U00011348"
    r"\U0001134b-\U0001134d\U00011357\U00011362-\U00011363\U00011366-\U0001136c\U00011370-\U00011374"
    r"\U00011435-\U00011446\U0001145e\U000114b0-\U000114c3\U000115af-\U000115b5\U000115b8-\U000115c0"
    r"\U000115dc-\U000115dd\U00011630-\U00011640\U000116ab-\U000116b7\U0001171d-\U0001172b"
    r"\U0001182c-\U0001183a\U00011930-\U00011935\U00011937-\U00011938\U0001193b-\U0001193e\U00011940"
    r"\U00011942-\U00011943\U000119d1-\U000119d7\U000119da-\U000119e0\U000119e4\U00011a01-\U00011a0a"
    r"\U00011a33-\U00011a39\U00011a3b-\U00011a3e\U00011a47\U00011a51-\U00011a5b\U00011a8a-\U00011a99"
    r"\U00011c2f-\U00011c36\U00011c38-\U00011c3f\U00011c92-\U00011ca7\U00011ca9-\U00011cb6"
    r"\U00011d31-\U00011d36\U00011d3a\U00011d3c-\U00011d3d\U00011d3f-\U00011d45\U00011d47"
    r"\U00011d8a-\U00011d8e\U00011d90-\U00011d91\U00011d93-\U00011d97\U00011ef3-\U00011ef6"
    r"\U00016af0-\U00016af4\U00016b30-\U00016b36\U00016f4f\U00016f51-\U00016f87\U00016f8f-\U00016f92"
    r"\U00016fe4\U00016ff0-\U00016ff1\U0001bc9d-\U0001bc9e\U0001cf00-\U0001cf2d\U0001cf30-\U0001cf46"
    r"\U0001d165-\U0001d169\U0001d16d-\U0001d172\U0001d17b-\U0001d182\U0001d185-\U0001d18b"
    r"\U0001d1aa-\U0001d1ad\U0001d242-\U0001d244\U0001da00-\U0001da36\U0001da3b-\U0001da6c\U0001da75"
    r"\U0001da84\U0001da9b-\U0001da9f\U0001daa1-\U0001daaf\U0001e000-\U0001e006\U0001e008-\U0001e018"
    r"\U0001e01b-\U0001e021\U0001e023-\U0001e024\U0001e026-\U0001e02a\U0001e130-\U0001e136\U0001e2ae"
    r"\U0001e2ec-\U0001e2ef\U0001e8d0-\U0001e8d6\U0001e944-\U0001e94a\U000e0100-\U000e01ef"
)
"""Every combining mark (categories Mn, Mc, Me of Unicode 14.0.0) as ranges of a PostgreSQL regular
expression, frozen with m014: words keep them, as keywords.words() and SQLite's tokenizer do."""


def _words_of(text: str) -> str:
    """SQL for the tsvector of a text expression since m014: read composed (NFC), CJK runs as pairs, cut into words
    of letters, digits and combining marks."""
    return (f"to_tsvector('memshelf_text'::regconfig, regexp_replace(memshelf_index_text(normalize({text}, NFC)),"
            f" '[^[:alnum:]{_MARKS}]+', ' ', 'g'))")


def _contexts_rewritten(holding: str) -> str:
    """SQL that makes again, with memshelf_words as it now is, the conversation context of every memory in a
    conversation (owner, topic) whose contents match `holding` (a condition on `content`). The conversations come
    first, in a CTE: as an IN (...) under row-level security PostgreSQL matched every row against each of its
    conversation's rows (135 s at 100,000 rows; 0.8 s so)."""
    return f"""SET LOCAL ROLE {ADMIN_ROLE};
WITH touched AS MATERIALIZED (SELECT DISTINCT tenant, user_id, topic FROM memories WHERE {holding})
UPDATE memories f SET context_search = (
    SELECT memshelf_words(string_agg(p.content, ' ' ORDER BY p.pk)) FROM (
        SELECT p.pk, p.content FROM memories p
        WHERE p.tenant = f.tenant AND p.user_id = f.user_id AND p.topic = f.topic AND p.pk < f.pk
        ORDER BY p.pk DESC LIMIT 2) p)
FROM touched
WHERE f.tenant = touched.tenant AND f.user_id = touched.user_id AND f.topic = touched.topic
  AND f.context_search IS NOT NULL;
RESET ROLE;"""


def tenant_wall(tables: Sequence[str], admin_policy_for_every_role: bool = False) -> str:
    """The wall every owner table has, for tables a later migration creates (pass their names, never the registry,
    so the migration's SQL stays what it was when applied): row-level security enabled and forced, the tenant policy
    and the admin policy as they stand since m005 (for memshelf_admin only; `admin_policy_for_every_role` as
    m009, m010 and m015 made it, until m016), and the grants to both roles."""
    admin_role = "" if admin_policy_for_every_role else f" TO {ADMIN_ROLE}"
    return "\n".join(f"""
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
CREATE POLICY memshelf_tenant ON {table}
    USING (tenant = nullif(current_setting('memshelf.tenant', true), ''))
    WITH CHECK (tenant = nullif(current_setting('memshelf.tenant', true), ''));
CREATE POLICY memshelf_admin ON {table}{admin_role}
    USING (current_user = '{ADMIN_ROLE}') WITH CHECK (current_user = '{ADMIN_ROLE}');
GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP_ROLE}, {ADMIN_ROLE};
""" for table in tables)


def scrub_relations(tables: Sequence[str]) -> str:
    """Let memshelf_scrub queue erasures of these tables (every one an erasure may touch, the first five included):
    the CHECK of m006 names its tables one by one. Pass the names, as for tenant_wall."""
    listed = ", ".join(f"'{table}'" for table in tables)
    return (f"ALTER TABLE memshelf_scrub DROP CONSTRAINT memshelf_scrub_relation_check,"
            f" ADD CONSTRAINT memshelf_scrub_relation_check CHECK (relation IN ({listed}));")

MIGRATIONS: list[tuple[str, str]] = [
    ("m001_initial", """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS unaccent;

CREATE TEXT SEARCH DICTIONARY memshelf_stem (TEMPLATE = snowball, LANGUAGE = english);
CREATE TEXT SEARCH CONFIGURATION memshelf_text (COPY = english);
ALTER TEXT SEARCH CONFIGURATION memshelf_text
    ALTER MAPPING FOR asciiword, asciihword, hword_asciipart, word, hword, hword_part WITH unaccent, memshelf_stem;

CREATE TABLE memories (
    pk           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           text NOT NULL,
    tenant       text NOT NULL,
    user_id      text NOT NULL,
    topic        text NOT NULL,
    content      text NOT NULL,
    digest       text NOT NULL,
    source       text NOT NULL,
    confidence   double precision NOT NULL,
    created_at   timestamptz NOT NULL,
    last_seen    timestamptz NOT NULL,
    observations integer NOT NULL DEFAULT 1,
    expires_at   timestamptz,
    -- No fixed dimension: each (model, dimensions) gets its own HNSW expression index, made on first use.
    embedding    vector,
    embed_model  text,
    search       tsvector GENERATED ALWAYS AS (
        to_tsvector('memshelf_text'::regconfig,
                    regexp_replace(topic || ' ' || content, '[^[:alnum:]]+', ' ', 'g'))) STORED,
    UNIQUE (tenant, user_id, id),
    UNIQUE (tenant, user_id, digest)
);
CREATE INDEX memories_owner_created ON memories (tenant, user_id, created_at);
CREATE INDEX memories_owner_model ON memories (tenant, user_id, embed_model);
CREATE INDEX memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memories_search ON memories USING gin (search);

CREATE TABLE facts (
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    key        text NOT NULL,
    value      text NOT NULL,
    source     text NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, user_id, key)
);
CREATE TABLE fact_history (
    pk      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant  text NOT NULL,
    user_id text NOT NULL,
    key     text NOT NULL,
    value   text NOT NULL,
    source  text NOT NULL,
    set_at  timestamptz NOT NULL
);
CREATE INDEX fact_history_owner ON fact_history (tenant, user_id, key, pk);

CREATE TABLE messages (
    pk         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         text NOT NULL,
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    thread     text NOT NULL,
    role       text NOT NULL,
    content    text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz,
    UNIQUE (tenant, user_id, id)
);
CREATE INDEX messages_thread ON messages (tenant, user_id, thread, pk);
CREATE INDEX messages_expiry ON messages (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE api_keys (
    id          text PRIMARY KEY,
    tenant      text,
    name        text NOT NULL,
    secret_hash text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
"""),
    ("m002_tenant_wall", f"""
-- Roles are shared by every database of the server; another database may be creating them right now.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['{APP_ROLE}', '{ADMIN_ROLE}'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOBYPASSRLS', name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
            END;
        END IF;
        -- The login role switches to these per transaction (SET LOCAL ROLE), so it must be a member.
        IF NOT pg_has_role(current_user, name, 'MEMBER') THEN
            EXECUTE format('GRANT %I TO %I', name, current_user);
        END IF;
    END LOOP;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO {APP_ROLE}, {ADMIN_ROLE}', current_schema());
    EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO {APP_ROLE}, {ADMIN_ROLE}', current_schema());
END $$;
{_TENANT_WALL}
"""),
    # PostgreSQL moves a row's largest values out of line once the row passes about 2 kB, and pgvector's `vector`
    # is stored EXTERNAL, so most 384-d rows (1.5 kB of vector plus text and tsvector) kept their vector in the
    # TOAST table: an owner's exact scan then made four or five buffer reads per row instead of one (27 ms for
    # 10,000 rows; 4-9 ms with the vector in the row). MAIN keeps the vector in the row unless the row cannot fit
    # in a page at all, and the higher target keeps the tsvector in the row too, so keyword ranking does not
    # fetch it from TOAST either. Affects rows written from now on; VACUUM FULL memories rewrites older ones.
    ("m003_vectors_in_the_row", """
ALTER TABLE memories ALTER COLUMN embedding SET STORAGE MAIN;
ALTER TABLE memories SET (toast_tuple_target = 8160);
"""),
    # The conversation context, as on SQLite: the words of the CONTEXT_TURNS memories the owner stored just before
    # this one under the same topic. Only the hybrid's keyword candidates are ranked with it (own words weigh
    # twice); rows still match by their own words alone. Kept as a tsvector only, and rewritten when a memory it
    # was made from is deleted, so a forgotten memory's words do not linger in its neighbours.
    ("m004_conversation_context", """
CREATE FUNCTION memshelf_words(text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT to_tsvector('memshelf_text'::regconfig, regexp_replace($1, '[^[:alnum:]]+', ' ', 'g')) $$;
ALTER TABLE memories ADD COLUMN context_search tsvector;
CREATE INDEX memories_owner_topic ON memories (tenant, user_id, topic, pk);
"""),
    # The login role is a member of memshelf_admin, and a policy `TO memshelf_admin` applies to its members too:
    # connected as the documented login role (not superuser, no BYPASSRLS) a query with no tenant set saw every
    # tenant. The admin policy now holds only while the role in effect IS memshelf_admin (after SET ROLE), and an
    # empty memshelf.tenant is the same as none.
    ("m005_admin_policy_only_as_admin", _ADMIN_ONLY_AS_ADMIN),
    # Erasures queue the tables they touched, in the erasing transaction; the store's upkeep thread (or
    # PostgresStore.scrub()) VACUUMs and reindexes them and deletes the rows it handled (postgres_upkeep.py).
    ("m006_scrub_queue", f"""
CREATE TABLE memshelf_scrub (
    pk        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    relation  text NOT NULL CHECK (relation IN ({", ".join(f"'{t}'" for t in _FIRST_WALLED)})),
    erased_at timestamptz NOT NULL DEFAULT now()
);
GRANT INSERT ON memshelf_scrub TO {APP_ROLE}, {ADMIN_ROLE};
GRANT USAGE ON SEQUENCE memshelf_scrub_pk_seq TO {APP_ROLE}, {ADMIN_ROLE};
"""),
    # Dedup ignores surrounding whitespace and runs of whitespace (stores.base.digest): every digest is recomputed
    # after this script, oldest row first. If two existing rows of an owner now share a digest, the older one takes
    # it and the newer keeps its old digest: both stay as they are (nothing merged); a new repeat counts on the older.
    (WHITESPACE_DIGESTS, "SELECT 1;"),
    # Pages are ordered newest first by (created_at, pk), with opaque cursors naming the last record's instant and
    # id (Shelf.list_messages); these keep that order an index walk.
    ("m008_message_pages_by_time", """
CREATE INDEX messages_owner_created ON messages (tenant, user_id, created_at, pk);
CREATE INDEX messages_thread_created ON messages (tenant, user_id, thread, created_at, pk);
"""),
    # Learning from conversations, as on SQLite (m008_learning there): the watermark per (owner, thread), the
    # evidence of learned records, and superseded memories kept closed instead of deleted. Both new tables get the
    # wall every owner table has, and the scrub queue takes them.
    ("m009_learning", f"""
CREATE TABLE learn_marks (
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    thread     text NOT NULL,
    message_id text NOT NULL,
    said_at    timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, user_id, thread)
);
CREATE TABLE learned_from (
    pk         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('memory', 'fact')),
    record     text NOT NULL,
    message_id text NOT NULL,
    thread     text,
    said_at    timestamptz
);
CREATE INDEX learned_from_record ON learned_from (tenant, user_id, kind, record);
CREATE INDEX learned_from_thread ON learned_from (tenant, user_id, thread);
GRANT USAGE ON SEQUENCE learned_from_pk_seq TO {APP_ROLE}, {ADMIN_ROLE};
ALTER TABLE memories ADD COLUMN superseded_at timestamptz, ADD COLUMN superseded_by text;
CREATE INDEX memories_superseded ON memories (tenant, user_id) WHERE superseded_at IS NOT NULL;
{tenant_wall(["learn_marks", "learned_from"], admin_policy_for_every_role=True)}
{scrub_relations([*_FIRST_WALLED, "learned_from", "learn_marks"])}
"""),
    # A memory longer than the embedding model's window is embedded in overlapping pieces (README, "Long memories"),
    # as on SQLite (m009_memory_pieces there): the row keeps its first piece's vector, this table the later pieces',
    # stamped with the row's model; they go with their memory (ON DELETE CASCADE). Searched exactly: few memories
    # are long, so an owner's pieces are few; the wall and the scrub queue take the table like every owner table.
    ("m010_memory_pieces", f"""
CREATE TABLE memory_pieces (
    memory_pk   bigint NOT NULL REFERENCES memories (pk) ON DELETE CASCADE,
    piece       integer NOT NULL,
    tenant      text NOT NULL,
    user_id     text NOT NULL,
    embed_model text NOT NULL,
    embedding   vector NOT NULL,
    PRIMARY KEY (memory_pk, piece)
);
ALTER TABLE memory_pieces ALTER COLUMN embedding SET STORAGE MAIN;
CREATE INDEX memory_pieces_owner ON memory_pieces (tenant, user_id, embed_model);
{tenant_wall(["memory_pieces"], admin_policy_for_every_role=True)}
{scrub_relations([*_FIRST_WALLED, "learned_from", "learn_marks", "memory_pieces"])}
"""),
    # Chinese, Japanese and Korean text is indexed as overlapping pairs of characters (keywords.index_text; README,
    # "Search text"), so a word is found inside a run with no spaces. memshelf_index_text is that function in SQL
    # (tests/test_search_text.py holds it to the Python one); the search column is remade with it, and the
    # conversation contexts made of CJK text are rewritten. Text without CJK is indexed exactly as before.
    ("m011_cjk_pairs", f"""
CREATE FUNCTION memshelf_index_text(text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT CASE WHEN $1 !~ '{_CJK}' THEN $1 ELSE (
        SELECT string_agg(CASE WHEN x.r[1] ~ '^{_CJK}' THEN ' ' || (
                   SELECT string_agg(substr(x.r[1], i, 2), ' ' ORDER BY i)
                   FROM generate_series(1, char_length(x.r[1])) i) || ' '
               ELSE x.r[1] END, '' ORDER BY x.n)
        FROM regexp_matches($1, '{_CJK}+|[^{_CJK[1:]}+', 'g') WITH ORDINALITY AS x(r, n)) END $$;
CREATE OR REPLACE FUNCTION memshelf_words(text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT to_tsvector('memshelf_text'::regconfig,
                             regexp_replace(memshelf_index_text($1), '[^[:alnum:]]+', ' ', 'g')) $$;
ALTER TABLE memories DROP COLUMN search;
ALTER TABLE memories ADD COLUMN search tsvector GENERATED ALWAYS AS (
    to_tsvector('memshelf_text'::regconfig,
                regexp_replace(memshelf_index_text(topic || ' ' || content), '[^[:alnum:]]+', ' ', 'g'))) STORED;
CREATE INDEX memories_search ON memories USING gin (search);
{_contexts_rewritten(f"content ~ '{_CJK}'")}
"""),
    # A mined or inferred memory the user vouched for becomes stated (Shelf.confirm); the row records when, and
    # the source it had, as on SQLite (m011_confirmed there).
    ("m012_confirmed", """
ALTER TABLE memories ADD COLUMN confirmed_at timestamptz;
ALTER TABLE memories ADD COLUMN confirmed_from text;
"""),
    # A fact's evidence names the value it taught (the set_at of the history row learning wrote), as on SQLite
    # (m018_evidence_set_at there); older rows have none.
    ("m013_evidence_set_at", """
ALTER TABLE learned_from ADD COLUMN set_at timestamptz;
"""),
    # Words keep their combining marks, and text is read composed (NFC), as keywords.words() reads questions and
    # SQLite's tables hold text (m017_word_marks there): the locale's [:alnum:] cut a Tamil word at its virama
    # and a decomposed "Zürich" into "zu" and "rich". The search column is remade, and the conversation contexts
    # holding marks are rewritten. Text that has no marks and that NFC leaves alone is indexed exactly as before
    # (contexts of the rare text NFC changes without marks, such as decomposed Hangul, are left as they were).
    # The database must be in UTF8 (normalize() refuses others): this says so before anything changes.
    ("m014_word_marks", f"""
DO $$ BEGIN
    IF current_setting('server_encoding') <> 'UTF8' THEN  -- normalize() needs it, and so does text of any script
        RAISE EXCEPTION USING MESSAGE = 'memshelf needs a database in UTF8 encoding, this one is '
            || current_setting('server_encoding')
            || ': create one with ENCODING ''UTF8'' and copy into it with memshelf migrate';
    END IF;
END $$;
CREATE OR REPLACE FUNCTION memshelf_words(text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT {_words_of("$1")} $$;
ALTER TABLE memories DROP COLUMN search;
ALTER TABLE memories ADD COLUMN search tsvector GENERATED ALWAYS AS ({_words_of("topic || ' ' || content")}) STORED;
CREATE INDEX memories_search ON memories USING gin (search);
{_contexts_rewritten(f"content ~ '[{_MARKS}]'")}
"""),
    # Keyword search finds its candidates through a btree of each owner's words (memory_words: one row per word of
    # a memory's search column, kept by triggers: added with the rows an INSERT adds, remade when a row's words
    # change, deleted with the rows a DELETE deletes; a foreign key instead cost a check per word and halved the
    # rate of remember_many). Under forced row-level
    # security PostgreSQL never used the GIN index of `search` (`@@` is not leakproof, so it may not run before the
    # tenant policy), and a search read every one of the owner's rows; text comparisons are leakproof, so a range
    # of this btree can. The GIN index is dropped: nothing could use it. A later migration that remakes `search`
    # must refill this table too.
    ("m015_memory_words", f"""
CREATE TABLE memory_words (
    tenant    text NOT NULL,
    user_id   text NOT NULL,
    word      text COLLATE "C" NOT NULL,
    memory_pk bigint NOT NULL,
    PRIMARY KEY (tenant, user_id, word, memory_pk)
);
-- No planner statistics of its text (pg_statistic would keep sample words and owner ids after an erasure until
-- the next ANALYZE; the search's plan is fixed by its own shape, not by these estimates).
ALTER TABLE memory_words ALTER COLUMN tenant SET STATISTICS 0, ALTER COLUMN user_id SET STATISTICS 0,
    ALTER COLUMN word SET STATISTICS 0;
{tenant_wall(["memory_words"], admin_policy_for_every_role=True)}
{scrub_relations([*_FIRST_WALLED, "learned_from", "learn_marks", "memory_pieces", "memory_words"])}
CREATE FUNCTION memshelf_words_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_words (tenant, user_id, word, memory_pk)
    SELECT n.tenant, n.user_id, w.lexeme, n.pk FROM memshelf_added n, unnest(n.search) w;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_words_added AFTER INSERT ON memories REFERENCING NEW TABLE AS memshelf_added
    FOR EACH STATEMENT EXECUTE FUNCTION memshelf_words_added();
CREATE FUNCTION memshelf_words_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_words w USING memshelf_deleted d, unnest(d.search) l
    WHERE w.tenant = d.tenant AND w.user_id = d.user_id AND w.word = l.lexeme AND w.memory_pk = d.pk;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_words_deleted AFTER DELETE ON memories REFERENCING OLD TABLE AS memshelf_deleted
    FOR EACH STATEMENT EXECUTE FUNCTION memshelf_words_deleted();
CREATE FUNCTION memshelf_words_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_words w USING unnest(OLD.search) l
    WHERE w.tenant = OLD.tenant AND w.user_id = OLD.user_id AND w.word = l.lexeme AND w.memory_pk = OLD.pk;
    INSERT INTO memory_words (tenant, user_id, word, memory_pk)
    SELECT NEW.tenant, NEW.user_id, w.lexeme, NEW.pk FROM unnest(NEW.search) w;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_words_changed AFTER UPDATE ON memories FOR EACH ROW
    WHEN (OLD.search IS DISTINCT FROM NEW.search OR OLD.tenant IS DISTINCT FROM NEW.tenant
          OR OLD.user_id IS DISTINCT FROM NEW.user_id)
    EXECUTE FUNCTION memshelf_words_changed();
SET LOCAL ROLE {ADMIN_ROLE};
INSERT INTO memory_words (tenant, user_id, word, memory_pk)
SELECT m.tenant, m.user_id, w.lexeme, m.pk FROM memories m, unnest(m.search) w;
RESET ROLE;
DROP INDEX memories_search;
"""),
    # The admin policy of the tables m009, m010 and m015 walled applied to every role. The wall was the same (its
    # test, current_user = memshelf_admin, holds for no other role), but PostgreSQL then tested both policies on
    # every row a query read, where for the first tables (TO memshelf_admin) it tests the tenant once per query:
    # counting a word's postings in memory_words took about twice as long (BENCHMARKS.md).
    ("m016_admin_policy_for_admin_only", "\n".join(
        f"ALTER POLICY memshelf_admin ON {table} TO {ADMIN_ROLE};"
        for table in ("learn_marks", "learned_from", "memory_pieces", "memory_words"))),
]
