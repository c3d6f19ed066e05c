"""PostgreSQL + pgvector: the backend for users who outgrow one machine.

Open it with `Shelf.open("postgresql://user:password@host/db")` (or MEMSHELF_DATABASE_URL). The server needs the
`vector` (pgvector >= 0.8) and `unaccent` extensions; the first open runs the migrations in _postgres_schema.py.

Tenant isolation has two walls:

1. every query filters by owner (tenant and user) in its WHERE clause, as on SQLite;
2. row-level security on tenant. Every owner table has ENABLE + FORCE ROW LEVEL SECURITY and a policy
   `tenant = current_setting('memshelf.tenant', true)`. Each operation runs in a transaction that does
   `SET LOCAL ROLE memshelf_app` and `set_config('memshelf.tenant', <the owner's tenant>, true)`, so a query that
   forgot its filter still sees only that tenant, and a connection with no tenant set sees nothing.
   Admin operations (backfill, purge_expired, owners, API keys) run as `memshelf_admin`, the one role a second
   policy lets see every tenant, and only while it is the role in effect (`current_user`), not for its members
   (m005): the login role itself, connected and acting as nothing else, sees nothing until a tenant is set.
   Switching role per transaction is also what makes the wall hold when the login role is a superuser
   (superusers and BYPASSRLS roles skip every policy, FORCE or not).

What a production deployment needs:

- a login role that is NOT a superuser and does NOT have BYPASSRLS, owning memshelf's tables (it runs the
  migrations, builds the vector indexes and scrubs erased rows; pg_checkpoint lets the scrub checkpoint at once);
- the roles `memshelf_app` and `memshelf_admin` (NOLOGIN), and the login role a member of both. The migration
  creates them when the login role may (superuser or CREATEROLE); otherwise a superuser runs once:
  `CREATE ROLE memshelf_app NOLOGIN; CREATE ROLE memshelf_admin NOLOGIN;
  GRANT memshelf_app, memshelf_admin TO <login role>;` and `CREATE EXTENSION vector; CREATE EXTENSION unaccent;`.
  On PostgreSQL 16+ prefer `GRANT memshelf_admin TO <login> WITH INHERIT FALSE` so that the login role itself,
  outside memshelf, is walled too.

Vectors: one `vector` column without a fixed dimension, kept in the row rather than in TOAST (m003). Each
(model, dimensions) pair the store serves gets two partial indexes, both `WHERE embed_model = '<model>' AND
vector_dims(embedding) = d`; searches repeat the predicate so the planner can use them. A store serves the models
of its own vectors (add_memories, set_vectors, vector_search, serve_model), never the stamps of imported rows; the
indexes are built CONCURRENTLY by the upkeep thread (_postgres_upkeep.py), and searches are exact until they are
valid:

- a covering btree on (tenant, user_id) INCLUDE (pk, confidence, expires_at, embedding), for vectors of up to 512
  dimensions and owner keys of up to 512 bytes (so every entry fits in a btree page). An owner with at most
  `exact_rows(limit)` vectors of the model (exact_max_rows, default 20,000, for the top 10, more for a wider
  search; counted with a capped index-only count) is searched exactly by an index-only scan of its entries, which
  lie together in the index however the owner's rows are spread over the table;
- an HNSW expression index `((embedding::vector(d)) vector_cosine_ops)`, up to pgvector's 2,000 dimensions, for
  larger owners, with `hnsw.iterative_scan = relaxed_order` so the owner filter cannot starve the top-k; if the
  index still comes back short the search is redone exactly.

A long memory's later pieces (memory_pieces; README, "Long memories") are not indexed: an owner that has any gets
them scanned exactly beside the search above, and each memory keeps its best score (_best_of).

The store interface keeps vectors as little-endian float32 blobs (the export format); they are converted to
pgvector's binary form at this boundary.

Keywords: a stored generated tsvector column over topic and content, its words also in memory_words (one row per
word and memory, kept by triggers, a btree that row-level security lets a search use, m015), with the `memshelf_text`
configuration (unaccented, English snowball stems, no stopwords) over the text as memshelf_index_text makes it
(CJK as pairs of characters, m011); each term becomes `'term':*` (prefix match) or `'term'` (keywords.is_prefix),
quoted so user text is never tsquery syntax, OR-ed. Ordered exactly as on SQLite, with bm25 for relevance, its
statistics (how many of the owner's memories hold each word, their number and length) gathered at query time
from the owner's own memories (bm25_query); a term whose word is in very many of them has only its newest matches
ranked (RANKED, NEWEST_RANKED), as on SQLite. The hybrid's keyword candidates are ranked with their conversation
context too (`context_search`: the words of the CONTEXT_TURNS memories the owner stored before under the same
topic, weight CONTEXT_WEIGHT against 1.0 for the row's own words); a row is found only by its own words either way.

Erasure deletes every row of the user or tenant (the tsvectors and vector live in the row, so they go with it);
deleting or purging single memories also rewrites the context of the memories that followed them. Each erasure
queues the tables it touched in memshelf_scrub; the upkeep thread scrubs them MEMSHELF_PG_SCRUB_DELAY seconds
later (default 60), off the request path: VACUUM, REINDEX TABLE CONCURRENTLY and CHECKPOINT (MEMSHELF_PG_SCRUB=
vacuum, the default), or VACUUM FULL (=full), or only when `scrub()` is called (=off); `scrub()` does it now.
What stays where afterwards, WAL included, is in the README ("Erasure on PostgreSQL").

Pool size: MEMSHELF_PG_POOL_SIZE (default 10, at most 1,000) connections per store.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, UTC
from typing import Any, overload
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import ConfigError, DimensionMismatch, InvalidInput, MemshelfError, StoreError, StoreUnavailable
from .._ids import new_ids
from ..keywords import is_prefix
from ..model import MAX_CONFIDENCE, Memory, NewMemory, Owner
from .base import BACKFILL_ADVICE, CONTEXT_TURNS, CURRENT, Pending, Scored, View, digest, observe_again
from .sql_records import (MEMORY_COLUMNS, MEMORY_WIDTH, SQLRecords, Statements, earlier_turns, later_turns,
                          memory_from_row, short_of_the_answer, view_condition)
from ._postgres_schema import ADMIN_ROLE, APP_ROLE, DERIVED_TABLES, MIGRATION_LOCK, MIGRATIONS, WHITESPACE_DIGESTS
from ._postgres_upkeep import Pair, Upkeep, scrub_settings

REQUIRED_EXTENSIONS = ("vector", "unaccent")
"""The extensions the migrations create (_postgres_schema.py); a superuser creates them where the login role may not."""
EXACT_MAX_ROWS = 20_000
"""Owners with at most this many vectors of a model are searched exactly when asked for the top 10 (at that size a
scan of the owner's rows is as fast as HNSW with a filter, and exact by definition); a wider search keeps the exact
path for larger owners (exact_rows)."""
EF_SEARCH = 200
"""HNSW candidate list for owner-filtered scans; 100 left a 1% owner at recall@10 0.93-0.99 across index builds."""
MAX_SCAN_TUPLES = 40_000
HNSW_MAX_DIMS = 2_000
"""pgvector indexes `vector` columns of up to 2,000 dimensions with HNSW; larger vectors are searched exactly."""
EXACT_INDEX_MAX_DIMS = 512
EXACT_INDEX_MAX_OWNER_BYTES = 512
"""The covering index of the exact path holds each row's vector next to its owner key. A btree entry has at most
2,704 bytes, which with an owner key of up to 512 bytes (UTF-8 tenant + user) leaves room for 512 dimensions.
Larger vectors, and the rare owners with longer keys, are scanned from the table instead (correct, slower)."""
OVERSAMPLE = 4
"""The HNSW path fetches OVERSAMPLE x limit (at least MIN_CANDIDATES) nearest rows of the owner and keeps the
best `limit` by exact distance: with a 1% owner this lifted recall@10 from 0.80 to 0.985 (tests/test_postgres.py)."""
MIN_CANDIDATES = 40
PAGE = 1_000
"""Rows per round trip when iterating an owner's memories."""
CONTEXT_WEIGHT = 0.5
"""Weight of a memory's conversation context in its term counts, against 1.0 for its own words (its length counts
in full, bm25_query)."""
K1 = 1.2
B = 0.75
"""bm25's term-frequency saturation and length normalisation, FTS5's values."""


def tsquery_text(terms: Sequence[str]) -> str:
    """Each term quoted as a tsquery lexeme, a prefix where keywords.is_prefix says so, OR-ed: user text is never
    tsquery syntax."""
    return " | ".join("'" + term.replace("\\", "\\\\").replace("'", "''") + "'" + ":*" * is_prefix(term)
                      for term in terms)


# ---------------------------------------------------------------- vectors at the boundary
class Blob:
    """A little-endian float32 vector blob on its way into a pgvector column."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def to_pgvector(blob: bytes) -> bytes:
    """pgvector's binary form: dimensions and an unused word (int16, big-endian), then big-endian float32s."""
    values = np.frombuffer(blob, dtype="<f4")
    return len(values).to_bytes(2, "big") + b"\x00\x00" + values.astype(">f4").tobytes()


def from_pgvector(data: bytes | memoryview) -> bytes:
    return np.frombuffer(data, dtype=">f4", offset=4).astype("<f4").tobytes()


class _BlobDumper(Dumper):
    format = Format.BINARY
    oid = 0  # set per database by _adapt_vectors

    def dump(self, obj: Blob) -> bytes:
        return to_pgvector(obj.data)


class _BlobLoader(Loader):
    format = Format.BINARY

    def load(self, data: Any) -> bytes:
        return from_pgvector(data)


class _TextBlobLoader(Loader):
    format = Format.TEXT

    def load(self, data: Any) -> bytes:
        text = bytes(data).decode().strip("[]")
        return np.array(text.split(",") if text else [], dtype="<f4").tobytes()


NEWEST_DIMENSIONS = ("SELECT vector_dims(embedding) FROM memories WHERE tenant = %s AND user_id = %s"
                     " AND embed_model = %s AND embedding IS NOT NULL ORDER BY created_at DESC LIMIT 1")
"""The dimensions of an owner's vectors of a model, from its newest. The order is what keeps the owner index in the
plan: with a bare LIMIT 1 the planner expected one of the owner's rows among the first few of the table whenever the
owner holds a large share of it, and scanned the table (or its primary key) until it met one: 10-16 ms at 200,000
rows for an owner of a quarter of them, on every vector search, against 0.1 ms through the index."""


# ---------------------------------------------------------------- rows
_LIVE = "(m.expires_at IS NULL OR m.expires_at > %s)"
_OWNER = "m.tenant = %s AND m.user_id = %s"


WORDS_MIN_ROWS = 2_000
"""Owners known to hold fewer memories (from their last keyword search, or counted before their first one in this
process) are searched by a statement without memory_words: at a few hundred memories every way is about a
millisecond, and the choice itself cost more (planning the larger statement cost a LongMemEval question, each its
owner's first, 1.4 ms: BENCHMARKS.md)."""
OWNER_HINTS = 100_000
"""At most this many owners' row counts are kept as hints (then the hints start over)."""
WORDS_SHARE = 0.2
"""A keyword search reads the memories that hold a question's words through memory_words when the words' postings
are at most this share of the owner's rows, and otherwise every one of the owner's rows (each a heap visit either
way, so the postings only pay when they skip most rows: BENCHMARKS.md)."""
RANKED = 500
"""A keyword search through memory_words ranks only some matches of a term whose own word is in more of the owner's
memories than this (or than its limit): that word's NEWEST_RANKED newest, beside every match of the question's rarer
terms (bm25_query; the same numbers as SQLite's; on the bench's common words at 10,000 memories per owner, about a
third of the time of ranking every match, BENCHMARKS.md)."""
NEWEST_RANKED = 100
"""How many of a common term's newest matches a bounded keyword search ranks (or its limit, if more)."""
GENERIC_PLANS = True
"""Whether the keyword statement of an owner of WORDS_MIN_ROWS or more is prepared and runs its generic plan (in its
own transaction; keyword_search). False plans it for each question, as before (for comparisons in one run)."""
_WORDS = ("SELECT DISTINCT t.i, l.lexeme COLLATE \"C\" AS word, t.prefix"
          " FROM unnest(%s::text[], %s::bool[]) WITH ORDINALITY AS t(term, prefix, i),"
          " unnest(to_tsvector('memshelf_text', t.term)) AS l")
"""The words of the question's terms (parameters: the terms, whether each is a prefix), numbered as the terms from
1. A term's words are those to_tsvector makes of it, which are the lexemes its tsquery matches."""
_POSTINGS = ("SELECT w.memory_pk FROM memory_words w WHERE w.tenant = %s AND w.user_id = %s"
             " AND w.word >= q.word AND w.word < q.word || CASE WHEN q.prefix THEN chr(1114111) ELSE chr(1) END"
             " OFFSET 0")
"""The postings of the owner's memories that hold the word `q` (parameters: the owner), from the btree of
memory_words (m015): a word matches itself, or, for a prefix term, every word that begins with it. So they lead to
every memory the term's tsquery matches (the query then checks each with `@@`). The bounds are byte-wise (the column
is COLLATE "C"): chr(1) is the least character, and no UTF-8 character sorts after chr(1114111). OFFSET 0 keeps the
subquery a parameterised index range per word (flattened, the planner read every posting of the owner)."""


def bm25_query(terms: Sequence[str], with_context: bool, order: str, seen: tuple[str, Sequence[Any]],
               owner: Owner, now: datetime, limit: int, words: bool = True, bound: float = math.inf,
               newest: int = NEWEST_RANKED) -> tuple[str, tuple[Any, ...]]:
    """keyword_search's SQL and parameters: the owner's memories that match any of the (distinct) `terms`, ranked by
    bm25 with the owner's own statistics, gathered at query time, so there is no state to keep in step with writes
    and no other owner's words move a score:

    - a term's document frequency is how many of the hits hold it (every memory of the owner holding a term is a
      hit), so expired and superseded memories do not count;
    - the number of documents is the owner's row count (an index-only count; like FTS5's, it includes expired and
      superseded rows until they are purged); the average length is the hits' (the owner's average scored the
      same on LoCoMo and reads every row);
    - a term occurs in a row or not (0 or 1): exact counts (ts_rank_cd) scored about the same and took up to 1.9
      times as long (BENCHMARKS.md).

    With context (the hybrid's candidates) a term also counts CONTEXT_WEIGHT where it is in the row's conversation
    context, whether or not it is in the row's own words (as in SQLite's context table), and the context's length
    counts in full toward the row's, as FTS5 counts every column's words in a row's length (counted at
    CONTEXT_WEIGHT, the default search scored LoCoMo frac@5 0.653 against 0.664 now, BENCHMARKS.md).
    Only the best `limit` rows are read back whole.

    Each row comes back with the owner's row count after its rank (the store's hint for the next search) and whether
    the search was bounded (below); with no hit, one row of those two alone (its memory columns NULL).

    The hits come by one of three ways, chosen in the statement (one-time filters on each half of a UNION ALL) from
    how many postings each term's own word has (an index-only count in memory_words) and how many postings the
    question would read (at most WORDS_SHARE of the owner's rows, or else none):

    - bounded, when a term's own word (as stemmed, not the words a prefix term begins) has more than `bound`
      postings: only that word's `newest` newest postings (by when the memories were stored; a backward range of
      the btree) and every posting of the other terms are read, and each term's document frequency comes from the
      postings (the common word's count, the others' memories), since the hits no longer hold every match: as in
      FTS5, expired and superseded memories count until purged. The caller ranks every match when what this gives
      cannot be the answer (keyword_search);
    - else through the postings, each row looked up by its key (a LATERAL subquery kept whole by OFFSET 0, so a
      planner that expects one row of the owner cannot turn it into a scan of them all);
    - else (more postings than WORDS_SHARE of the owner's rows) from every row of the owner, every match ranked;
      the same rows and scores as through the postings.

    With `words` False (an owner known to be small, WORDS_MIN_ROWS) the statement has only the last way, and costs
    what it did before memory_words. The CTEs of hits and statistics are MATERIALIZED: under row-level security the
    planner expects one hit, and an inlined `stats` was computed again for every hit (quadratic: 14 ms instead of
    1.4 ms for 268 hits, BENCHMARKS.md)."""
    count = len(terms)
    weight = f"{float(CONTEXT_WEIGHT)!r}::float8"
    context = "coalesce(m.context_search, ''::tsvector)"
    length = f"length(m.search) + length({context})" if with_context else "length(m.search)"
    found = "".join(f", (m.search @@ t.q{i})::int::float8 AS own{i}" for i in range(count))
    if with_context:
        found += "".join(f", ({context} @@ t.q{i})::int::float8 AS near{i}" for i in range(count))
    tf = [f"(h.own{i} + {weight} * h.near{i})" if with_context else f"h.own{i}" for i in range(count)]
    k1, b = f"{K1!r}::float8", f"{B!r}::float8"
    score = " + ".join(f"ln(1 + (s.n - s.df{i} + 0.5) / (s.df{i} + 0.5)) * {f} * ({k1} + 1)"
                       f" / ({f} + {k1} * (1 - {b} + {b} * h.dl / s.avgdl))" for i, f in enumerate(tf))
    queries = "".join(f"to_tsquery('memshelf_text', %s) AS q{i}, " for i in range(count))
    condition, seen_params = seen

    def hits(way: str) -> str:
        return (f"SELECT m.pk, m.confidence, m.created_at, ({length})::float8 AS dl{found} FROM memories m, tsq t"
                f" WHERE {way} AND m.search @@ t.q AND {_OWNER} AND {_LIVE}{condition}")

    hit_params = (owner.tenant, owner.user, now, *seen_params)
    if words:
        few = "(SELECT few FROM owned)"
        ways = (f" words AS MATERIALIZED ({_WORDS}),"
                " counts AS MATERIALIZED (SELECT q.i, sum(c.n)::float8 AS df FROM words q,"
                " LATERAL (SELECT count(*) AS n FROM memory_words w WHERE w.tenant = %s AND w.user_id = %s"
                " AND w.word = q.word) c GROUP BY q.i),"
                " postings AS MATERIALIZED (SELECT * FROM (SELECT q.i, w.memory_pk FROM words q"
                " JOIN counts c ON c.i = q.i,"
                " LATERAL (SELECT w.memory_pk FROM memory_words w WHERE w.tenant = %s AND w.user_id = %s"
                " AND w.word = q.word ORDER BY w.memory_pk DESC LIMIT %s) w WHERE c.df > %s::float8"
                f" UNION ALL SELECT q.i, w.memory_pk FROM words q JOIN counts c ON c.i = q.i, LATERAL ({_POSTINGS}) w"
                f" WHERE c.df <= %s::float8) p LIMIT {few} + 1),"
                f" way AS MATERIALIZED (SELECT count(*) <= {few} AS postings, count(*) <= {few}"
                " AND (SELECT coalesce(max(df) > %s::float8, false) FROM counts) AS bounded FROM postings),"
                " tally AS MATERIALIZED (SELECT c.i, CASE WHEN c.df > %s::float8 THEN c.df ELSE"
                " (SELECT count(DISTINCT p.memory_pk) FROM postings p WHERE p.i = c.i) END AS df FROM counts c),"
                " hits AS MATERIALIZED (SELECT h.* FROM (SELECT DISTINCT memory_pk FROM postings) p,"
                f" LATERAL ({hits('m.pk = p.memory_pk')} OFFSET 0) h WHERE (SELECT postings FROM way)"
                f" UNION ALL {hits('NOT (SELECT postings FROM way)')}),")
        way_params = (list(terms), [is_prefix(term) for term in terms], owner.tenant, owner.user,
                      owner.tenant, owner.user, newest, bound, owner.tenant, owner.user, bound, bound, bound,
                      *hit_params, *hit_params)
        bounded = "(SELECT bounded FROM way)"
        df = "".join(f", CASE WHEN {bounded} THEN coalesce((SELECT df FROM tally WHERE i = {i + 1}), 0)"
                     f" ELSE count(*) FILTER (WHERE own{i} > 0)::float8 END AS df{i}" for i in range(count))
    else:
        ways, way_params, bounded = f" hits AS MATERIALIZED ({hits('true')}),", hit_params, "false"
        df = "".join(f", count(*) FILTER (WHERE own{i} > 0)::float8 AS df{i}" for i in range(count))
    # The questions' tsqueries are made once for both ways; with one way they are inlined, as constants of the scan
    # (a joined CTE row cost a small owner's search about a third more: 0.77 -> 1.2 ms).
    inlined = "MATERIALIZED" if words else "NOT MATERIALIZED"
    sql = (f"WITH tsq AS {inlined} (SELECT {queries}to_tsquery('memshelf_text', %s) AS q),"
           f" owned AS MATERIALIZED (SELECT count(*)::float8 AS n, ceil(count(*) * {WORDS_SHARE!r}) AS few"
           f" FROM memories m WHERE {_OWNER}),{ways}"
           f" stats AS MATERIALIZED (SELECT avg(dl) AS avgdl{df}, (SELECT n FROM owned) AS n,"
           f" {bounded} AS bounded FROM hits),"
           f" best AS (SELECT h.pk, h.confidence, h.created_at, {score} AS rank FROM hits h, stats s"
           f" ORDER BY {order} LIMIT %s)"
           f" SELECT m.*, r.rank, s.n, s.bounded FROM stats s LEFT JOIN best r ON true"
           f" LEFT JOIN LATERAL (SELECT {MEMORY_COLUMNS} FROM memories m WHERE m.pk = r.pk OFFSET 0) m ON true"
           f" ORDER BY {', '.join('r.' + key for key in order.split(', '))}")
    params = (*(tsquery_text([term]) for term in terms), tsquery_text(terms), owner.tenant, owner.user,
              *way_params, limit)
    return sql, params


def _context_of(tenant: str, user: str, topic: str, before: str = "") -> str:
    """SQL for the words of the CONTEXT_TURNS memories of (tenant, user, topic) with pk below `before` (default:
    all), oldest first; NULL when there are none."""
    turns = earlier_turns(tenant, user, topic, before or None)
    return f"(SELECT memshelf_words(string_agg(p.content, ' ' ORDER BY p.pk)) FROM ({turns}) p)"


@overload
def _utc(value: datetime) -> datetime: ...
@overload
def _utc(value: None) -> None: ...
def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _memory(row: Sequence) -> Memory:
    return memory_from_row(row, _utc)


def _by_digest(rows: Sequence[Sequence]) -> dict[str, tuple[int, Memory]]:
    """Rows read as (pk, MEMORY_COLUMNS..., digest), by digest: (pk, memory)."""
    return {row[MEMORY_WIDTH + 1]: (row[0], _memory(row[1:])) for row in rows}


def index_names(model: str, dimensions: int) -> dict[str, str]:
    """The indexes a (model, dimensions) pair gets, by kind: "hnsw" up to HNSW_MAX_DIMS, "exact" (the covering
    index the exact path scans) up to EXACT_INDEX_MAX_DIMS."""
    tag = f"{hashlib.sha256(model.encode()).hexdigest()[:16]}_{dimensions}"
    names = {}
    if dimensions <= HNSW_MAX_DIMS:
        names["hnsw"] = f"memories_hnsw_{tag}"
    if dimensions <= EXACT_INDEX_MAX_DIMS:
        names["exact"] = f"memories_exact_{tag}"
    return names


def index_statements(model: str, dimensions: int, concurrently: bool) -> list[tuple[str, sql.Composed]]:
    """Each index of a (model, dimensions) pair, as (name, CREATE INDEX [CONCURRENTLY] IF NOT EXISTS ...)."""
    templates = {
        "hnsw": "CREATE INDEX {how} IF NOT EXISTS {name} ON memories USING hnsw ({cast} vector_cosine_ops)"
                " WHERE {vector}",
        "exact": "CREATE INDEX {how} IF NOT EXISTS {name} ON memories (tenant, user_id)"
                 " INCLUDE (pk, confidence, expires_at, embedding) WHERE {vector} AND {short}",
    }
    return [(name, sql.SQL(templates[kind]).format(
        how=sql.SQL("CONCURRENTLY" if concurrently else ""), name=sql.Identifier(name), cast=_cast(dimensions, ""),
        vector=_vector_predicate(model, dimensions, ""), short=_short_owner(""))) for kind, name in
        index_names(model, dimensions).items()]


_VALID_INDEXES = ("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                  " WHERE i.indrelid = 'memories'::regclass AND i.indisvalid")
"""Names of memories' valid indexes (add a condition on c.relname)."""


def _vector_predicate(model: str, dimensions: int, alias: str = "m.") -> sql.Composed:
    """The partial-index predicate, with the model as a literal so the planner can match the index
    (a bound parameter would hide the value from a generic plan)."""
    return sql.SQL("{alias}embed_model = {model} AND vector_dims({alias}embedding) = {dims}").format(
        alias=sql.SQL(alias), model=sql.Literal(model), dims=sql.Literal(dimensions))


def _short_owner(alias: str = "m.") -> sql.Composed:
    """The covering index's bound on the owner's key, so that every row it takes fits in a btree entry."""
    return sql.SQL("octet_length({alias}tenant) + octet_length({alias}user_id) <= {limit}").format(
        alias=sql.SQL(alias), limit=sql.Literal(EXACT_INDEX_MAX_OWNER_BYTES))


def _fits_exact_index(owner: Owner) -> bool:
    return len(owner.tenant.encode()) + len(owner.user.encode()) <= EXACT_INDEX_MAX_OWNER_BYTES


def _seen(view: View) -> tuple[sql.SQL, tuple]:
    """A view's condition (starting with AND) as psycopg SQL, and its parameters."""
    condition, params = view_condition(view, _utc)
    return sql.SQL(condition.replace("?", "%s")), params


def exact_query(owner: Owner, model: str, dimensions: int, view: View = CURRENT) -> sql.Composed:
    """The exact path's query; parameters: query vector, tenant, user, now, the view's, limit, tenant, user, tenant,
    floor, limit.

    Superseded rows are dropped after the scan, not in it, so that the scan stays index-only (superseded_at is not
    in the covering index): it takes `limit` more rows than the owner has superseded (counted through the small
    partial index memories_superseded), and the join drops those. A view of the past filters in the scan.

    Ordering by the score (not by the distance operator) keeps the planner off the HNSW index. The scan reads
    only what the covering index holds (pk, confidence, expiry, vector), stored in owner order, so it never visits
    the table however the owner's rows are spread over it; the text of the few winners is read afterwards. The
    owner-key bound is the index's own predicate, repeated so the planner can use the index."""
    vector = _vector_predicate(model, dimensions)
    if _fits_exact_index(owner):
        vector = sql.SQL("{} AND {}").format(vector, _short_owner())
    return sql.SQL(
        "WITH top AS MATERIALIZED (SELECT m.pk, m.confidence, 1 - ({cast} <=> %s::vector({dims})) AS score"
        " FROM memories m WHERE {owner} AND {live}{seen} AND {vector}"
        " ORDER BY score DESC, m.confidence DESC, m.pk DESC LIMIT %s + (SELECT count(*) FROM memories s"
        "   WHERE s.tenant = %s AND s.user_id = %s AND s.superseded_at IS NOT NULL))"
        " SELECT {columns}, m.pk, top.score FROM top JOIN memories m ON m.pk = top.pk AND m.tenant = %s"
        " WHERE top.score >= %s{current} ORDER BY top.score DESC, top.confidence DESC, top.pk DESC LIMIT %s").format(
        columns=sql.SQL(MEMORY_COLUMNS), cast=_cast(dimensions), dims=sql.Literal(dimensions),
        owner=sql.SQL(_OWNER), live=sql.SQL(_LIVE), vector=vector,
        seen=sql.SQL("") if view == CURRENT else _seen(view)[0],
        current=sql.SQL(" AND m.superseded_at IS NULL" if view == CURRENT else ""))


def _cast(dimensions: int, alias: str = "m.") -> sql.Composed:
    return sql.SQL("({}embedding::vector({}))").format(sql.SQL(alias), sql.Literal(dimensions))


def setup_advice(conn: psycopg.Connection) -> str:
    """What a superuser must run once so that this connection's login role can set memshelf up: the SQL for what
    the catalog shows missing (the schema's ownership, the extensions, the two roles and membership in them)."""
    login, database, schema, owns_schema = conn.execute(
        "SELECT current_user, current_database(), current_schema(), pg_has_role(current_user, n.nspowner, 'USAGE')"
        " FROM pg_namespace n WHERE n.nspname = current_schema()").fetchone() or ("?", "?", "public", False)
    extensions = {row[0] for row in conn.execute("SELECT extname FROM pg_extension")}
    roles: dict[str, bool] = dict(conn.execute("SELECT rolname, pg_has_role(current_user, oid, 'MEMBER')"
                                               " FROM pg_roles WHERE rolname IN (%s, %s)",
                                               (APP_ROLE, ADMIN_ROLE)).fetchall())
    return setup_sql(login, database, schema, owns_schema=owns_schema, extensions=extensions, roles=roles)


def setup_sql(login: str, database: str, schema: str, *, owns_schema: bool, extensions: set[str],
              roles: dict[str, bool]) -> str:
    """setup_advice from what the catalog says: `extensions` installed in the database, `roles` that exist, each
    with whether the login role is a member."""
    statements = [] if owns_schema else [f"ALTER SCHEMA {_quoted(schema)} OWNER TO {_quoted(login)};"]
    statements += [f"CREATE EXTENSION IF NOT EXISTS {ext};" for ext in REQUIRED_EXTENSIONS if ext not in extensions]
    statements += [f"CREATE ROLE {role} NOLOGIN;" for role in (APP_ROLE, ADMIN_ROLE) if role not in roles]
    if not all(roles.get(role) for role in (APP_ROLE, ADMIN_ROLE)):
        statements.append(f"GRANT {APP_ROLE}, {ADMIN_ROLE} TO {_quoted(login)};")
    if not statements:
        return (f"the login role {login} must own memshelf's tables in database {database}: as a superuser run "
                f"ALTER TABLE <table> OWNER TO {_quoted(login)}; for each table it does not own, then retry")
    return (f"the login role {login} may not create what memshelf needs; run once as a superuser in database "
            f"{database}: {' '.join(statements)} Then retry")


def _quoted(identifier: str) -> str:
    """An identifier as SQL to print (double quotes, doubled inside), so a role named alice-2 can be pasted."""
    return '"' + identifier.replace('"', '""') + '"'


def _translate(exc: psycopg.Error, url_hint: str) -> MemshelfError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "expected" in text and "dimensions" in text:
        return DimensionMismatch(
            f"stored vectors have another length than the question's ({text}): one model name was used for two "
            "models", BACKFILL_ADVICE, fix="backfill")
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return StoreError(f"PostgreSQL refused ({text}): memshelf's login role (the URL's user) must own memshelf's "
                          f"tables and be a member of {APP_ROLE} and {ADMIN_ROLE}; as a superuser run GRANT "
                          f"{APP_ROLE}, {ADMIN_ROLE} TO <that user>; and ALTER TABLE <table> OWNER TO <that user>; "
                          "for each of memshelf's tables it does not own")
    state = exc.sqlstate or ""
    if state.startswith("54"):  # program limit exceeded: a value or row too large for the server
        return StoreError(f"PostgreSQL refused a record beyond its limits ({text}): shorten the text or use "
                          "an embedding model with fewer dimensions")
    if isinstance(exc, psycopg.OperationalError) and (not state or state.startswith(("08", "57P"))):
        return StoreUnavailable(f"cannot talk to PostgreSQL at {url_hint} ({text}): check that the server is "
                                "running and the URL, user and password are right, then retry")
    if state in _BUSY_STATES:
        return StoreUnavailable(f"PostgreSQL is busy ({text}): nothing was written; retry")
    if state.startswith(("22", "23")):  # data exception, integrity constraint: the values, not the server
        return InvalidInput(f"PostgreSQL refused the values ({text}): nothing was written; correct the input")
    return StoreError(f"PostgreSQL failed ({text}): check the server log")


_BUSY_STATES = frozenset({
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "53300",  # too_many_connections
})
"""SQLSTATEs that say the server is busy, not that the request is wrong: the same request may succeed if retried."""


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest and ":" in rest.split("@", 1)[0]:
        user = rest.split("@", 1)[0].split(":", 1)[0]
        rest = f"{user}:***@{rest.split('@', 1)[1]}"
    return f"{scheme}{sep}{rest}"


MAX_POOL_SIZE = 1_000


def pool_size_setting(explicit: int | None) -> int:
    """Connections per store: the pool_size argument, else MEMSHELF_PG_POOL_SIZE, else 10."""
    given: object
    if explicit is None:
        given = os.environ.get("MEMSHELF_PG_POOL_SIZE", "").strip() or "10"
        digits = given.isascii() and given.isdigit() and len(given) < 10  # int() of thousands of digits raises
        where, size = "MEMSHELF_PG_POOL_SIZE", int(given) if digits else 0
    else:
        given = explicit
        where, size = "pool_size", explicit if isinstance(explicit, int) and not isinstance(explicit, bool) else 0
    if not 1 <= size <= MAX_POOL_SIZE:
        raise ConfigError(f"{where} must be a whole number of connections from 1 to {MAX_POOL_SIZE:,}, "
                          f"got {given!r}: set it to e.g. 10")
    return size


class PostgresStore(SQLRecords):
    """A pool of connections; inside atomic() one connection is bound to the current thread."""

    def __init__(self, url: str, *, exact_max_rows: int = EXACT_MAX_ROWS, pool_size: int | None = None) -> None:
        self.url = url
        self.exact_max_rows = exact_max_rows
        self._hint = _redact(url)
        self._local = threading.local()
        self._indexes: set[str] = set()  # vector indexes seen valid
        self._served: set[Pair] = set()  # pairs whose indexes this store has asked for
        self._owner_rows: dict[Owner, int] = {}  # each owner's row count at its last keyword search (a hint)
        size = pool_size_setting(pool_size)
        mode, delay = scrub_settings()
        self._upkeep = Upkeep(self._connect, index_statements, mode=mode, delay=delay)
        scrub_pending = self._migrate()
        self._pool = ConnectionPool(url, min_size=1, max_size=size, open=False,
                                    kwargs={"autocommit": True}, configure=self._configure,
                                    name="memshelf")
        try:
            self._pool.open(wait=True, timeout=30)
        except psycopg.Error as exc:
            self._pool.close()
            raise _translate(exc, self._hint) from exc
        if scrub_pending:  # erasures a stopped process queued and did not scrub
            self._upkeep.erased()

    # ------------------------------------------------------------ connections and transactions
    def _connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=15)
        except psycopg.Error as exc:
            raise _translate(exc, self._hint) from exc

    def _migrate(self) -> bool:
        """Apply the migrations; whether erasures are waiting in memshelf_scrub."""
        with self._connect() as conn:
            try:
                for name, script in MIGRATIONS:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                        conn.execute("CREATE TABLE IF NOT EXISTS memshelf_migrations"
                                     " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
                        if conn.execute("SELECT 1 FROM memshelf_migrations WHERE name = %s", (name,)).fetchone():
                            continue
                        conn.execute(script)  # type: ignore[arg-type]  # our own constant, several statements
                        if name == WHITESPACE_DIGESTS:
                            _redigest(conn)
                        conn.execute("INSERT INTO memshelf_migrations (name) VALUES (%s)", (name,))
                self._indexes = {r[0] for r in conn.execute(_VALID_INDEXES + " AND (c.relname LIKE 'memories_hnsw_%%'"
                                                             " OR c.relname LIKE 'memories_exact_%%')")}
                if conn.execute("SELECT to_regclass('memshelf_scrub')").fetchone() == (None,):
                    return False  # a test that stops at an older migration
                return conn.execute("SELECT EXISTS (SELECT 1 FROM memshelf_scrub)").fetchone() == (True,)
            except psycopg.errors.InsufficientPrivilege as exc:
                raise StoreError(f"cannot set up memshelf's schema ({str(exc).splitlines()[0]}): "
                                 f"{setup_advice(conn)}") from exc
            except psycopg.errors.UndefinedFile as exc:
                raise StoreError(f"the PostgreSQL server lacks an extension memshelf needs ({exc}): install "
                                 "pgvector and the contrib package (unaccent) on the server, then retry") from exc
            except psycopg.Error as exc:
                raise _translate(exc, self._hint) from exc

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute("SET TIME ZONE 'UTC'")
        info = TypeInfo.fetch(conn, "vector")
        if info is None:
            raise StoreError("the vector type is missing: run CREATE EXTENSION vector on the database")
        info.register(conn)
        conn.adapters.register_dumper(Blob, type("BlobDumper", (_BlobDumper,), {"oid": info.oid}))
        conn.adapters.register_loader(info.oid, _BlobLoader)
        conn.adapters.register_loader(info.oid, _TextBlobLoader)

    def applied_migrations(self) -> list[str]:
        with self._admin() as cur:
            cur.execute("SET LOCAL ROLE NONE")
            return [r[0] for r in cur.execute("SELECT name FROM memshelf_migrations ORDER BY name")]

    def reads_aside(self) -> bool:
        """Outside atomic() every read takes a pooled connection and waits on the server: the two sides of a hybrid
        search run at once (about 1.3 times as fast on LoCoMo, BENCHMARKS.md)."""
        return getattr(self._local, "conn", None) is None

    @contextmanager
    def atomic(self) -> Iterator[None]:
        conn = getattr(self._local, "conn", None)
        try:
            if conn is not None:
                with conn.transaction():  # a savepoint
                    yield
                return
            with self._pool.connection() as conn:
                self._local.conn = conn
                try:
                    with conn.transaction():
                        yield
                finally:
                    self._local.conn = None
        except psycopg.Error as exc:
            raise _translate(exc, self._hint) from exc

    @contextmanager
    def _scoped(self, role: str, tenant: str | None, generic_plans: bool = False) -> Iterator[psycopg.Cursor]:
        """A cursor in a transaction running as `role`, with row-level security set to `tenant`; with
        generic_plans, a prepared statement runs its generic plan (plan_cache_mode) until the transaction ends."""
        with self.atomic():
            cur = self._local.conn.cursor(binary=True)
            try:
                cur.execute("SELECT set_config('role', %s, true), set_config('memshelf.tenant', %s, true)"
                            + (", set_config('plan_cache_mode', 'force_generic_plan', true)" if generic_plans else ""),
                            (role, tenant or ""))
                yield cur
            except psycopg.Error as exc:
                raise _translate(exc, self._hint) from exc
            finally:
                cur.close()

    def _tenant(self, tenant: str) -> Any:
        return self._scoped(APP_ROLE, tenant)

    def _admin(self) -> Any:
        return self._scoped(ADMIN_ROLE, None)

    # ------------------------------------------------------------ the records half's dialect (sql_records.py)
    PARAM = "%s"
    LOCK_ROW = " FOR UPDATE"
    FOLDED = 'lower({} COLLATE "C")'  # the C collation's lower() folds only ASCII, as SQLite's does

    def _time_in(self, value: datetime | None) -> datetime | None:
        return value

    def _time_out(self, value: datetime | None) -> datetime | None:
        return _utc(value)

    def _owner_scope(self, tenant: str, write: bool = True) -> AbstractContextManager[Statements]:
        return self._tenant(tenant)  # type: ignore[no-any-return]

    def hold_thread(self, owner: Owner, thread: str) -> None:
        with self._tenant(owner.tenant) as db:
            self._thread_lock(db, owner, thread, shared=True)

    def _thread_lock(self, db: Statements, owner: Owner, thread: str, shared: bool) -> None:
        """An advisory lock on the thread until the transaction ends: shared while turns are logged, exclusive while
        a learn reads (64-bit hash of the owner and thread; a collision only makes two threads wait on each other)."""
        function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        db.execute(f"SELECT {function}(hashtextextended(%s, 0))", ("\x1f".join(("memshelf-thread", owner.tenant,
                                                                                 owner.user, thread)),))

    def _admin_scope(self, write: bool = True) -> AbstractContextManager[Statements]:
        return self._admin()  # type: ignore[no-any-return]

    def close(self) -> None:
        self._upkeep.close()
        self._pool.close()

    # ------------------------------------------------------------ vector indexes
    def _has_indexes(self, cur: psycopg.Cursor, model: str, dimensions: int, kinds: Iterable[str]) -> bool:
        """Whether the indexes of these kinds (those the pair gets at all) exist and are valid (a concurrent build
        makes an index visible long before it is usable), asking the catalog only about names not yet seen valid."""
        names = index_names(model, dimensions)
        wanted = {names[k] for k in kinds if k in names}
        if wanted - self._indexes:
            self._indexes |= {r[0] for r in cur.execute(_VALID_INDEXES + " AND c.relname = ANY(%s)", (sorted(wanted),))}
        return wanted <= self._indexes

    def _serve(self, pairs: Iterable[Pair]) -> None:
        """This store serves these (model, dimensions): queue concurrent builds of their indexes, once per store,
        off the request path (inside bulk_load, this thread's builds wait for the end of the block). Called with
        the models of the caller's own vectors (add_memories, set_vectors, vector_search), never with the stamps
        of imported rows: an import cannot make the server build indexes."""
        new = {pair for pair in pairs if pair not in self._served and index_names(*pair)}
        if not new:
            return
        bulk = getattr(self._local, "bulk", None)
        if bulk is not None:
            bulk |= new
            return
        self._served |= new
        self._upkeep.build(sorted(new))

    def _loaded(self, pairs: Iterable[Pair]) -> None:
        """Imported rows: their models get indexes only at the end of this thread's bulk_load (an operator's
        migration or benchmark), never from an import alone."""
        bulk = getattr(self._local, "bulk", None)
        if bulk is not None:
            bulk |= {pair for pair in pairs if index_names(*pair)}

    def serve_model(self, model: str, dimensions: int) -> None:
        """Build the indexes of `model` (vectors of `dimensions`) in the background now, rather than at the first
        write or search of it. Searches are exact until the indexes are valid."""
        self._serve({(model, dimensions)})

    def wait_for_indexes(self, timeout: float = 300.0) -> bool:
        """Wait until every queued index build is done: True, or False if `timeout` seconds passed first."""
        return self._upkeep.wait(timeout)

    @contextmanager
    def bulk_load(self, memory: str | None = None) -> Iterator[None]:
        """For large imports from this thread: inside the block, models written or imported get no vector indexes;
        at the end each missing one is built in one pass, not concurrently (several times faster than growing an
        HNSW graph row by row; writes to memories wait for it), then `memories` and `memory_words` are vacuumed and
        analyzed, so the planner knows the new rows and index-only scans need not visit the tables. Searches in
        between are exact. Other threads are not affected. `memory` is maintenance_work_mem for the build (default
        MEMSHELF_PG_BUILD_MEMORY or 1GB; the HNSW graph of 1M 384-d vectors needs about 2GB in memory)."""
        if getattr(self._local, "bulk", None) is not None:  # nested: the outer block builds
            yield
            return
        self._local.bulk = set()
        try:
            yield
        finally:
            pending, self._local.bulk = self._local.bulk, None
            self._build_loaded(pending, memory or os.environ.get("MEMSHELF_PG_BUILD_MEMORY", "1GB"))
        if getattr(self._local, "conn", None) is None:  # VACUUM cannot run inside a transaction
            try:
                with self._pool.connection() as conn:
                    conn.execute("VACUUM (ANALYZE) memories, memory_words")
            except psycopg.Error as exc:
                raise _translate(exc, self._hint) from exc

    def _build_loaded(self, pairs: set[Pair], memory: str) -> None:
        pairs = {pair for pair in pairs if not self._has_valid(pair)}
        if not pairs:
            return
        self._served |= pairs
        if getattr(self._local, "conn", None) is not None:
            # Inside a transaction of this thread the loaded rows are not committed yet, and a build on another
            # connection would wait for this very transaction: the background builds them after it ends.
            self._upkeep.build(sorted(pairs))
            return
        try:
            self._upkeep.build_now(pairs, memory)
        except psycopg.Error as exc:
            raise _translate(exc, self._hint) from exc

    def _has_valid(self, pair: Pair) -> bool:
        with self._admin() as cur:
            return self._has_indexes(cur, *pair, ("hnsw", "exact"))

    @staticmethod
    def _pairs(models_and_blobs: Iterable[tuple[str | None, bytes | None]]) -> set[tuple[str, int]]:
        return {(model, len(blob) // 4) for model, blob in models_and_blobs if model and blob is not None}

    # ------------------------------------------------------------ memories
    def add_memories(self, owner: Owner, items: Sequence[NewMemory], now: datetime) -> list[Memory]:
        """A batch in a few statements: the owner's rows under the batch's texts are locked and read at once, the new
        ones go in as import_memories writes rows (COPY, then one INSERT that makes each context), and repeats, of
        a stored row or of one earlier in the batch, are observed again one by one, in the order given."""
        self._serve(self._pairs((i.embed_model, i.vector) for i in items))
        keys = [digest(item.topic, item.content) for item in items]
        with self._tenant(owner.tenant) as cur:
            current = self._held(cur, owner, keys)  # digest -> (pk, memory) as it stands now
            first: dict[str, int] = {}  # digest -> the item that writes it
            for n, key in enumerate(keys):
                if key not in current:
                    first.setdefault(key, n)
            fresh = [items[n] for n in first.values()]
            records = [Memory(memory_id, item.topic, item.content, item.source, item.confidence, item.created_at,
                              expires_at=item.expires_at, last_seen=now, embed_model=item.embed_model)
                       for memory_id, item in zip(new_ids("m", len(fresh)), fresh)]
            written = _by_digest(self._insert_copied(cur, owner, records, [item.vector for item in fresh],
                                                     [item.pieces for item in fresh]))
            lost = [key for key in first if key not in written]  # another writer stored the same text meanwhile
            current.update(self._held(cur, owner, lost) if lost else {})
            stored: list[Memory] = []
            for n, (item, key) in enumerate(zip(items, keys)):
                if first.get(key) == n and key in written:
                    current[key] = written[key]
                else:
                    if key not in current:
                        raise StoreError("a memory vanished while it was being observed again: retry the write")
                    pk, memory = current[key]
                    current[key] = pk, self._observe_again(cur, owner, pk, memory, item, now)
                stored.append(current[key][1])
        return stored

    @staticmethod
    def _held(cur: psycopg.Cursor, owner: Owner, keys: Sequence[str]) -> dict[str, tuple[int, Memory]]:
        """The owner's rows with these digests, locked for the transaction: digest -> (pk, memory)."""
        return _by_digest(cur.execute(
            f"SELECT m.pk, {MEMORY_COLUMNS}, m.digest FROM memories m WHERE {_OWNER} AND m.digest = ANY(%s)"
            " ORDER BY m.pk FOR UPDATE", (owner.tenant, owner.user, list(dict.fromkeys(keys)))).fetchall())

    def _observe_again(self, cur: psycopg.Cursor, owner: Owner, pk: int, memory: Memory, item: NewMemory,
                       now: datetime) -> Memory:
        successor = None
        if memory.superseded_by is not None:
            found = cur.execute(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE {_OWNER} AND m.id = %s",
                                (owner.tenant, owner.user, memory.superseded_by)).fetchone()
            successor = None if found is None else _memory(found)
        seen = observe_again(memory, item, now, successor=successor)
        updated = cur.execute(
            "UPDATE memories AS m SET observations = observations + 1, last_seen = %s, expires_at = %s,"
            " source = %s, confidence = %s"
            + (", embedding = %s, embed_model = %s" if seen.replace_vector else "")
            + (", superseded_at = NULL, superseded_by = NULL" if seen.reopen else "")
            + (", confirmed_at = NULL, confirmed_from = NULL" if seen.revived else "")
            + f" WHERE pk = %s RETURNING {MEMORY_COLUMNS}",
            (now, seen.expires_at, seen.source, seen.confidence,
             *((Blob(item.vector or b""), item.embed_model) if seen.replace_vector else ()), pk)).fetchone()
        assert updated is not None  # the row was just read under the same transaction
        if seen.replace_vector:
            self._put_pieces(cur, pk, item.embed_model, item.pieces)
        return _memory(updated)

    @staticmethod
    def _put_pieces(cur: psycopg.Cursor, key: int, model: str | None, pieces: Sequence[bytes]) -> None:
        """Make `pieces` (of `model`) the later pieces of memory `key`, in place of any it had."""
        cur.execute("DELETE FROM memory_pieces WHERE memory_pk = %s", (key,))
        if pieces:
            cur.executemany("INSERT INTO memory_pieces (memory_pk, piece, tenant, user_id, embed_model, embedding)"
                            " SELECT pk, %s, tenant, user_id, %s, %s FROM memories WHERE pk = %s",
                            [(number, model, Blob(blob), key) for number, blob in enumerate(pieces, 1)])

    def import_memories(self, owner: Owner, items: Sequence[Memory], vectors: Sequence[bytes | None],
                        pieces: Sequence[Sequence[bytes]] = ()) -> int:
        """COPY into a temporary table, then one INSERT ... ON CONFLICT DO NOTHING (skips ids and texts the owner
        already has), in input order. This is also the bulk path: about as fast as PostgreSQL ingests."""
        if not items:
            return 0
        with self._tenant(owner.tenant) as cur:
            self._loaded(self._pairs((m.embed_model, v) for m, v in zip(items, vectors)))
            return len(self._insert_copied(cur, owner, items, vectors, pieces or [()] * len(items)))

    def _insert_copied(self, cur: psycopg.Cursor, owner: Owner, items: Sequence[Memory],
                       vectors: Sequence[bytes | None], pieces: Sequence[Sequence[bytes]]) -> list[tuple]:
        """Rows as they are given, through a temporary table: one COPY, one INSERT ... ON CONFLICT DO NOTHING (which
        skips ids and texts the owner already has), in input order, each row's context made in SQL. Returns every row
        written as (pk, MEMORY_COLUMNS..., digest), the form _held reads."""
        if not items:
            return []
        cur.execute("CREATE TEMP TABLE IF NOT EXISTS memshelf_import (ord integer, id text, topic text,"
                    " content text, digest text, source text, confidence double precision,"
                    " created_at timestamptz, last_seen timestamptz, observations integer,"
                    " expires_at timestamptz, embedding vector, embed_model text, superseded_at timestamptz,"
                    " superseded_by text, confirmed_at timestamptz, confirmed_from text) ON COMMIT DELETE ROWS")
        cur.execute("DELETE FROM memshelf_import")  # emptied at commit; this is for a second call inside one
        with cur.copy("COPY memshelf_import FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["integer", "text", "text", "text", "text", "text", "double precision",
                            "timestamptz", "timestamptz", "integer", "timestamptz", "vector", "text",
                            "timestamptz", "text", "timestamptz", "text"])
            for n, (memory, vector) in enumerate(zip(items, vectors)):
                copy.write_row((n, memory.id, memory.topic, memory.content, digest(memory.topic, memory.content),
                                memory.source, memory.confidence, memory.created_at,
                                memory.last_seen or memory.created_at, memory.observations, memory.expires_at,
                                None if vector is None else Blob(vector),
                                memory.embed_model if vector is not None else None, memory.superseded_at,
                                memory.superseded_by, memory.confirmed_at, memory.confirmed_from))
        # Each row's context: the previous CONTEXT_TURNS rows of its topic, counting the owner's newest stored
        # ones and then the batch in order (a row the INSERT skips as already stored still counts).
        lags = ", ".join(f"lag(content, {n}) OVER w" for n in range(CONTEXT_TURNS, 0, -1))
        cur.execute(
            "WITH prior AS (SELECT t.topic, p.pk, p.content FROM (SELECT DISTINCT topic FROM memshelf_import) t"
            "   CROSS JOIN LATERAL (SELECT pk, content FROM memories WHERE tenant = %s AND user_id = %s"
            f"   AND topic = t.topic ORDER BY pk DESC LIMIT {CONTEXT_TURNS}) p),"
            " turns AS (SELECT topic, content, NULL::integer AS ord, 0 AS part, pk AS seq FROM prior"
            "   UNION ALL SELECT topic, content, ord, 1, ord FROM memshelf_import),"
            f" context AS (SELECT ord, nullif(concat_ws(' ', {lags}), '') AS words FROM turns"
            "   WINDOW w AS (PARTITION BY topic ORDER BY part, seq))"
            " INSERT INTO memories AS m (id, tenant, user_id, topic, content, digest, source, confidence, created_at,"
            " last_seen, observations, expires_at, embedding, embed_model, context_search, superseded_at,"
            " superseded_by, confirmed_at, confirmed_from)"
            " SELECT i.id, %s, %s, i.topic, i.content, i.digest, i.source, i.confidence, i.created_at,"
            " i.last_seen, i.observations, i.expires_at, i.embedding, i.embed_model, memshelf_words(c.words),"
            " i.superseded_at, i.superseded_by, i.confirmed_at, i.confirmed_from"
            " FROM memshelf_import i JOIN context c ON c.ord = i.ord ORDER BY i.ord"
            f" ON CONFLICT DO NOTHING RETURNING m.pk, {MEMORY_COLUMNS}, m.digest",
            (owner.tenant, owner.user, owner.tenant, owner.user))
        written = cur.fetchall()
        keys = {row[1]: row[0] for row in written}  # id -> pk
        for memory, vector, later in zip(items, vectors, pieces):
            if later and vector is not None and memory.id in keys:
                self._put_pieces(cur, keys[memory.id], memory.embed_model, later)
        return written

    def memory_pieces(self, owner: Owner, ids: Sequence[str]) -> dict[str, list[bytes]]:
        found: dict[str, list[bytes]] = {}
        with self._tenant(owner.tenant) as cur:
            for memory_id, blob in cur.execute(
                    "SELECT m.id, p.embedding FROM memories m JOIN memory_pieces p ON p.memory_pk = m.pk"
                    f" WHERE {_OWNER} AND m.id = ANY(%s) AND p.embed_model = m.embed_model ORDER BY m.pk, p.piece",
                    (owner.tenant, owner.user, list(ids))).fetchall():
                found.setdefault(memory_id, []).append(blob)
        return found

    def get_memory(self, owner: Owner, memory_id: str, now: datetime) -> Memory | None:
        with self._tenant(owner.tenant) as cur:
            row = cur.execute(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE {_OWNER} AND m.id = %s AND {_LIVE}",
                              (owner.tenant, owner.user, memory_id, now)).fetchone()
        return None if row is None else _memory(row)

    def delete_memory(self, owner: Owner, memory_id: str) -> bool:
        with self._tenant(owner.tenant) as cur:
            self._hand_back_places(cur, owner, [memory_id])  # type: ignore[arg-type]  # a psycopg cursor
            gone = cur.execute("DELETE FROM memories WHERE tenant = %s AND user_id = %s AND id = %s"
                               " RETURNING tenant, user_id, topic, pk",
                               (owner.tenant, owner.user, memory_id)).fetchall()
            self._recontext(cur, gone)
            evidence = self._drop_evidence(cur, owner, "memory", [memory_id] if gone else [])
            self._queue_scrub(cur, {"memories": len(gone), "learned_from": evidence})
            return bool(gone)

    def supersede_memory(self, owner: Owner, old_id: str, new_id: str, now: datetime) -> bool:
        with self._tenant(owner.tenant) as cur:
            return bool(cur.execute("UPDATE memories SET superseded_at = %s, superseded_by = %s WHERE tenant = %s"
                                    " AND user_id = %s AND id = %s AND superseded_at IS NULL",
                                    (now, new_id, owner.tenant, owner.user, old_id)).rowcount)

    @staticmethod
    def _recontext(cur: psycopg.Cursor, gone: Sequence[Sequence]) -> None:
        """Rewrite the context of the memories that followed deleted ones (tenant, user_id, topic, pk), so no
        deleted memory's words stay in a neighbour's context."""
        if not gone:
            return
        tenants, users, topics, pks = (list(column) for column in zip(*gone))
        cur.execute(
            f"UPDATE memories f SET context_search = {_context_of('f.tenant', 'f.user_id', 'f.topic', 'f.pk')}"
            " WHERE f.pk IN (SELECT n.pk FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[])"
            "   AS g(tenant, user_id, topic, pk)"
            f"   CROSS JOIN LATERAL ({later_turns('n.pk', 'g.tenant', 'g.user_id', 'g.topic', 'g.pk')}) n)",
            (tenants, users, topics, pks))

    def iter_memories(self, owner: Owner, now: datetime | None) -> Iterator[tuple[Memory, bytes | None]]:
        """Pages of PAGE rows by key, each page in its own short transaction, so a slow consumer holds nothing."""
        after = 0
        while True:
            with self._tenant(owner.tenant) as cur:
                rows = cur.execute(
                    f"SELECT {MEMORY_COLUMNS}, m.embedding, m.pk FROM memories m WHERE {_OWNER} AND m.pk > %s"
                    + ("" if now is None else f" AND {_LIVE}") + " ORDER BY m.pk LIMIT %s",
                    (owner.tenant, owner.user, after, *(() if now is None else (now,)), PAGE)).fetchall()
            for row in rows:
                yield _memory(row), row[MEMORY_WIDTH]
            if len(rows) < PAGE:
                return
            after = rows[-1][MEMORY_WIDTH + 1]

    def keyword_search(self, owner: Owner, terms: Sequence[str], limit: int, now: datetime,
                       by_confidence: bool, view: View = CURRENT) -> list[Scored]:
        if not terms:
            return []
        seen, at = view_condition(view, _utc)
        # The hybrid's candidates (not by_confidence) are ranked with their conversation context too, as on
        # SQLite; either way a row is found only by its own words.
        order = ("confidence DESC, rank DESC, created_at DESC, pk DESC" if by_confidence else
                 "rank DESC, created_at DESC, pk DESC")
        known = self._owner_rows.get(owner)
        if known is None:  # the owner's first search here: its rows, counted, choose the statement
            known = self._count_owner_rows(owner)
            self._note_owner_rows(owner, known)
        large = known >= WORDS_MIN_ROWS

        # The statement that can read memory_words chooses its way inside itself, so one generic plan serves every
        # question of its shape, and planning it was a quarter or more of its time: it is prepared and runs that
        # plan (in its own transaction: inside a caller's, the setting would outlive it). The small owner's statement
        # is planned for each question: its generic plan, blind to the owner and the words, took 2.4 to 5 times as
        # long on common words (BENCHMARKS.md, "PostgreSQL keyword search: one generic plan").
        generic = GENERIC_PLANS and large and getattr(self._local, "conn", None) is None

        def ranked(bound: float) -> tuple[list[Sequence], bool]:
            statement, params = bm25_query(list(dict.fromkeys(terms)), not by_confidence, order,
                                           (self._sql(seen), at), owner, now, limit, words=large, bound=bound,
                                           newest=max(NEWEST_RANKED, limit))
            with self._scoped(APP_ROLE, owner.tenant, generic_plans=generic) as cur:
                rows = cur.execute(statement, params, prepare=generic).fetchall()
            self._note_owner_rows(owner, int(rows[0][MEMORY_WIDTH + 1]))
            return [row for row in rows if row[0] is not None], bool(rows[0][MEMORY_WIDTH + 2])

        rows, bounded = ranked(max(RANKED, limit))
        if bounded and short_of_the_answer(rows, limit, by_confidence, MAX_CONFIDENCE):
            # What the bound ranked cannot be the answer: too few of a common term's newest matches are current, or
            # an older match may be more confident than the last hit. Every match is ranked instead.
            rows, _ = ranked(math.inf)
        return [Scored(_memory(r), float(r[MEMORY_WIDTH])) for r in rows]

    def _note_owner_rows(self, owner: Owner, rows: int) -> None:
        if len(self._owner_rows) >= OWNER_HINTS:
            self._owner_rows.clear()
        self._owner_rows[owner] = rows

    def _count_owner_rows(self, owner: Owner) -> int:
        with self._tenant(owner.tenant) as cur:
            return int(cur.execute(f"SELECT count(*) FROM memories m WHERE {_OWNER}", (owner.tenant, owner.user),
                                   prepare=False).fetchone()[0])

    # ------------------------------------------------------------ vectors
    def vector_search(self, owner: Owner, model: str, query: np.ndarray, limit: int, floor: float,
                      now: datetime, view: View = CURRENT) -> list[Scored]:
        query = np.asarray(query, dtype=np.float32)
        dimensions = int(query.shape[0])
        exact = self.exact_rows(limit)
        with self._tenant(owner.tenant) as cur:
            stored, rows, pieced = self._owner_vector_shape(cur, owner, model, exact)
            if stored is None:
                return []
            if stored != dimensions:
                raise DimensionMismatch(
                    f"the question's vector from {model} has {dimensions} dimensions but this owner's stored "
                    f"{model} vectors have {stored}: the service now serves another model under that name",
                    BACKFILL_ADVICE, fix="backfill")
            self._serve({(model, dimensions)})
            blob = Blob(query.astype("<f4").tobytes())
            indexed = "hnsw" in index_names(model, dimensions) and self._has_indexes(cur, model, dimensions, ("hnsw",))
            found = None
            if rows > exact and indexed:
                found = self._approximate(cur, owner, model, blob, dimensions, limit, floor, now, view)
            if found is None:
                found = self._exact(cur, owner, model, blob, dimensions, limit, floor, now, view)
            if not pieced:
                return found
            return _best_of(found, self._piece_hits(cur, owner, model, blob, dimensions, limit, floor, now, view),
                            limit)

    def _piece_hits(self, cur: psycopg.Cursor, owner: Owner, model: str, blob: Blob, dimensions: int, limit: int,
                    floor: float, now: datetime, view: View) -> list[Scored]:
        """The best `limit` memories by their best later piece (exact: an owner's pieces are few, one per 200 or so
        words beyond a long memory's first piece)."""
        seen, at = _seen(view)
        query = sql.SQL(
            "SELECT {columns}, best.score FROM (SELECT p.memory_pk, max(1 - ({cast} <=> %s::vector({dims}))) AS score"
            " FROM memory_pieces p WHERE p.tenant = %s AND p.user_id = %s AND {vector} GROUP BY p.memory_pk) best"
            " JOIN memories m ON m.pk = best.memory_pk WHERE {owner} AND m.embed_model = %s AND {live}{seen}"
            " AND best.score >= %s ORDER BY best.score DESC, m.confidence DESC, m.pk DESC LIMIT %s").format(
            columns=sql.SQL(MEMORY_COLUMNS), cast=_cast(dimensions, "p."), dims=sql.Literal(dimensions),
            vector=_vector_predicate(model, dimensions, "p."), owner=sql.SQL(_OWNER), live=sql.SQL(_LIVE), seen=seen)
        rows = cur.execute(query, (blob, owner.tenant, owner.user, owner.tenant, owner.user, model, now, *at, floor,
                                   limit)).fetchall()
        return [Scored(_memory(r), float(r[MEMORY_WIDTH])) for r in rows]

    def exact_rows(self, limit: int) -> int:
        """The most vectors an owner may have for a search of the top `limit` to be exact rather than through HNSW.

        An exact search costs about the owner's rows; the HNSW path walks the index until it has found its
        candidates (OVERSAMPLE x limit) among every owner's rows, so it costs about the candidates times the table
        over the owner's rows. The two are equal at an owner size that grows with the square root of the
        candidates: exact_max_rows is that size for the top 10, and the hybrid's 50 candidates keep the exact path
        up to about 2.2 times as many rows (BENCHMARKS.md, "PostgreSQL: the exact path for wider searches")."""
        return int(self.exact_max_rows * math.sqrt(max(limit * OVERSAMPLE, MIN_CANDIDATES) / MIN_CANDIDATES))

    def _owner_vector_shape(self, cur: psycopg.Cursor, owner: Owner, model: str, cap: int
                            ) -> tuple[int | None, int, bool]:
        """The dimensions of the owner's vectors of `model` (None when it has none), how many rows it has, counted
        up to `cap` + 1 only, through the owner index, so the count stays cheap, and whether it has later
        pieces of long memories (most owners have none, and their searches skip the pieces' query)."""
        row = cur.execute(
            f"SELECT ({NEWEST_DIMENSIONS}),"
            "       (SELECT count(*) FROM (SELECT 1 FROM memories WHERE tenant = %s AND user_id = %s"
            "        AND embed_model = %s LIMIT %s) s),"
            "       EXISTS (SELECT 1 FROM memory_pieces WHERE tenant = %s AND user_id = %s AND embed_model = %s)",
            (owner.tenant, owner.user, model, owner.tenant, owner.user, model, cap + 1,
             owner.tenant, owner.user, model)).fetchone()
        return (None, 0, False) if row is None else (row[0], row[1], row[2])

    def _exact(self, cur: psycopg.Cursor, owner: Owner, model: str, blob: Blob, dimensions: int, limit: int,
               floor: float, now: datetime, view: View) -> list[Scored]:
        seen = () if view == CURRENT else _seen(view)[1]
        rows = cur.execute(exact_query(owner, model, dimensions, view),
                           (blob, owner.tenant, owner.user, now, *seen, limit, owner.tenant, owner.user, owner.tenant,
                            floor, limit)).fetchall()
        return [Scored(_memory(r), float(r[MEMORY_WIDTH + 1])) for r in rows]

    def _approximate(self, cur: psycopg.Cursor, owner: Owner, model: str, blob: Blob, dimensions: int,
                     limit: int, floor: float, now: datetime, view: View) -> list[Scored] | None:
        """HNSW top-`limit` within the owner, with iterative scans so the owner filter cannot starve it.
        None when the index came back short (the caller then searches exactly)."""
        cur.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),"
                    " set_config('hnsw.ef_search', %s, true), set_config('hnsw.max_scan_tuples', %s, true)",
                    (str(max(EF_SEARCH, limit * OVERSAMPLE)), str(MAX_SCAN_TUPLES)))
        query = sql.SQL(
            "WITH c AS MATERIALIZED (SELECT {columns}, m.pk, {cast} <=> %s::vector({dims}) AS distance"
            " FROM memories m WHERE {owner} AND {live}{seen} AND {vector} ORDER BY distance LIMIT %s)"
            " SELECT *, 1 - distance AS score FROM c ORDER BY distance, confidence DESC, pk DESC").format(
            columns=sql.SQL(MEMORY_COLUMNS), cast=_cast(dimensions), dims=sql.Literal(dimensions),
            owner=sql.SQL(_OWNER), live=sql.SQL(_LIVE), seen=_seen(view)[0],
            vector=_vector_predicate(model, dimensions))
        wanted = max(limit * OVERSAMPLE, MIN_CANDIDATES)
        rows = cur.execute(query, (blob, owner.tenant, owner.user, now, *_seen(view)[1], wanted)).fetchall()
        if len(rows) < wanted:
            return None  # the scan stopped early (max_scan_tuples) or the owner has fewer live rows
        score = MEMORY_WIDTH + 2
        return [Scored(_memory(r), float(r[score])) for r in rows[:limit] if float(r[score]) >= floor]

    def pending_vectors(self, model: str, after: int, limit: int) -> list[Pending]:
        with self._admin() as cur:
            rows = cur.execute("SELECT pk, content FROM memories WHERE pk > %s AND (embed_model IS NULL"
                               " OR embed_model <> %s OR embedding IS NULL) ORDER BY pk LIMIT %s",
                               (after, model, limit)).fetchall()
        return [Pending(r[0], r[1]) for r in rows]

    def count_pending_vectors(self, model: str) -> int:
        with self._admin() as cur:
            return cur.execute("SELECT count(*) FROM memories WHERE embed_model IS NULL OR embed_model <> %s"
                               " OR embedding IS NULL", (model,)).fetchone()[0]

    def count_unembedded(self, owner: Owner, model: str, now: datetime) -> int:
        with self._tenant(owner.tenant) as cur:
            return cur.execute(f"SELECT count(*) FROM memories m WHERE {_OWNER} AND {_LIVE} AND m.superseded_at IS NULL"
                               " AND (embed_model IS NULL OR embed_model <> %s OR embedding IS NULL)",
                               (owner.tenant, owner.user, now, model)).fetchone()[0]

    def vector_dimensions(self, owner: Owner, model: str) -> int | None:
        with self._tenant(owner.tenant) as cur:
            row = cur.execute(NEWEST_DIMENSIONS, (owner.tenant, owner.user, model)).fetchone()
        return None if row is None else int(row[0])

    def set_vectors(self, model: str, rows: Iterable[tuple[int, bytes, Sequence[bytes]]]) -> None:
        rows = list(rows)
        self._serve(self._pairs((model, blob) for _, blob, _ in rows))
        with self._admin() as cur:
            cur.executemany("UPDATE memories SET embedding = %s, embed_model = %s WHERE pk = %s",
                            [(Blob(blob), model, key) for key, blob, _ in rows])
            for key, _, pieces in rows:
                self._put_pieces(cur, key, model, pieces)

    # ------------------------------------------------------------ the memory half's share of erasure
    def _remove_memories(self, db: Statements, where: str, params: tuple, whole_tenant: str | None
                         ) -> tuple[int, set[str]]:
        """The tsvectors and vectors live in the row: they go with it. Every memory of the owner goes, so no
        context needs rewriting."""
        return db.execute(f"DELETE FROM memories WHERE {where}", params).rowcount, set()

    def _purge_memories(self, db: Statements, now: datetime) -> tuple[int, set[str]]:
        gone = db.execute("DELETE FROM memories WHERE expires_at IS NOT NULL AND expires_at <= %s"
                          " RETURNING tenant, user_id, topic, pk", (now,)).fetchall()
        self._recontext(db, gone)  # type: ignore[arg-type]  # the admin scope's psycopg cursor
        return len(gone), set()

    def _delete_memories(self, db: Statements, owner: Owner, ids: Sequence[str]) -> tuple[int, set[str]]:
        gone = db.execute("DELETE FROM memories WHERE tenant = %s AND user_id = %s AND id = ANY(%s)"
                          " RETURNING tenant, user_id, topic, pk", (owner.tenant, owner.user, list(ids))).fetchall()
        self._recontext(db, gone)  # type: ignore[arg-type]  # the owner scope's psycopg cursor
        return len(gone), set()

    def _erasing(self, db: Statements, counts: dict[str, int]) -> None:
        self._queue_scrub(db, counts)  # type: ignore[arg-type]  # a psycopg cursor

    def _queue_scrub(self, cur: psycopg.Cursor, erased: dict[str, int]) -> None:
        """Queue the tables that lost rows for the scrub, in the erasing transaction, and wake the upkeep thread
        (the wake-up is harmless if that transaction then rolls back: the scrub finds nothing queued)."""
        tables = [table for table, count in erased.items() if count]
        if erased.get("memories"):
            tables += ["memory_pieces", *DERIVED_TABLES]  # go with their memories (cascade; m015's trigger)
        if tables:
            cur.execute("INSERT INTO memshelf_scrub (relation) SELECT unnest(%s::text[])", (tables,))
            self._upkeep.erased()

    @property
    def scrub_pending(self) -> bool:
        """Whether erasures wait in memshelf_scrub (queued by any process) for the background scrub or scrub().
        When the queue cannot be read (inside a transaction, whose role may not read it; the server out of reach
        just after an erasure committed) the answer is True: what may be so, and never an error for an erasure
        that is done."""
        if getattr(self._local, "conn", None) is not None:
            return True
        try:
            with self._pool.connection(timeout=5) as conn:
                return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM memshelf_scrub)").fetchone()[0])  # type: ignore[index]
        except (psycopg.Error, PoolTimeout):
            return True

    def _erased(self, counts: dict[str, int], touched: set[str], whole_owner: bool) -> bool:
        return self.scrub_pending  # the erasure is queued; the scrub runs later

    def finish_scrub(self, full: bool | None = None) -> bool:
        self.scrub(full)
        return self.scrub_pending

    def scrub(self, full: bool | None = None) -> list[str]:
        """Scrub erased rows off disk now, instead of waiting for the background scrub; returns the tables
        scrubbed. Default (MEMSHELF_PG_SCRUB=vacuum): VACUUM, REINDEX CONCURRENTLY and CHECKPOINT, after which the
        erased text is in no index file; full=True (or MEMSHELF_PG_SCRUB=full): VACUUM FULL, after which it is in
        no table or index file either, at the cost of locking the tables while they are rewritten. README,
        "Erasure on PostgreSQL", says what remains where."""
        if getattr(self._local, "conn", None) is not None:
            raise StoreError("scrub() cannot run inside atomic(): VACUUM needs its own transaction; call it after")
        try:
            return self._upkeep.scrub(full)
        except psycopg.Error as exc:
            raise _translate(exc, self._hint) from exc


def _best_of(rows: list[Scored], pieces: list[Scored], limit: int) -> list[Scored]:
    """The best `limit` memories by their best vector, the row's (its first piece) or a later piece's: ordered by
    score, then confidence. Exact when each list holds its own best `limit`."""
    if not pieces:
        return rows
    best: dict[str, Scored] = {}
    for hit in (*rows, *pieces):
        held = best.get(hit.memory.id)
        if held is None or hit.score > held.score:
            best[hit.memory.id] = hit
    return sorted(best.values(), key=lambda hit: (-hit.score, -hit.memory.confidence))[:limit]


def _redigest(conn: psycopg.Connection) -> None:
    """Recompute every memory's digest with whitespace normalised (stores.base.digest), oldest first, as the admin
    role (row-level security hides every row from a login role that is not a superuser). When two rows of an owner
    now share a digest, the older takes it and the newer keeps its old one: both stay, nothing is merged."""
    conn.execute(f"SET LOCAL ROLE {ADMIN_ROLE}")
    with conn.cursor(name="memshelf_redigest") as rows:
        rows.execute("SELECT pk, tenant, user_id, topic, content, digest FROM memories ORDER BY pk")
        changed = [(new, pk, tenant, user) for pk, tenant, user, topic, content, old in rows
                   if (new := digest(topic, content)) != old]
    for new, pk, tenant, user in changed:
        conn.execute("UPDATE memories SET digest = %s WHERE pk = %s AND NOT EXISTS (SELECT 1 FROM memories"
                     " WHERE tenant = %s AND user_id = %s AND digest = %s)", (new, pk, tenant, user, new))
    conn.execute("RESET ROLE")

