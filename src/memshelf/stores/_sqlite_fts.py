"""Full-text indexes of the SQLite store, one pair per tenant.

bm25 ranks with statistics of the whole FTS5 table it runs on (how many rows hold a word, the average length). In
one table shared by every tenant, the scores and the order of a tenant's hits would move with other tenants' words:
a side channel across tenants. So each tenant gets its own two tables, created on its first memory:

- `fts_<h>` (topic, content, owner_tag): keyword search ranks a row by its own words;
- `ctx_<h>` (topic, content, owner_tag, context): the hybrid search ranks its keyword candidates with the
  conversation around them (stores/sqlite_schema.py, m003).

`fts_tenants` lists each tenant's pair, how many full merges each pair had since it was last rebuilt, and whether
its deletions take entries out in place (`secure`, see SECURE_DELETE).

Both are external-content tables over `memories`, holding each text as keywords.index_text makes it (Chinese,
Japanese and Korean as overlapping character pairs; other text as it is); the store keeps them in step on every
insert, delete and context rewrite, inside the same transaction. Erasing a tenant drops its tables. Users of one
tenant still share statistics (the tenant is the unit of isolation for ranking; the owner filter is in every query).
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence

from ..keywords import index_text
from ..model import MAX_CONFIDENCE
from ._sqlite_lib import sqlite3

TOKENIZER = "porter unicode61 remove_diacritics 2 categories 'L* N* Co M*'"
"""How the per-tenant tables cut text into words: letters, digits, private use and combining marks (unicode61 cut
words at marks by default, so Hindi "राहुल" was indexed as र, ह, ल and found by no question; m017 reindexed every
table with marks kept, as PostgreSQL's parser keeps them and keywords.words() reads questions)."""
_TOKENIZE = "'" + TOKENIZER.replace("'", "''") + "'"

Query = Callable[..., sqlite3.Cursor]
Many = Callable[[str, Iterable[Sequence]], None]

INDEX_TEXT = "memshelf_index_text"
"""keywords.index_text as an SQL function of every connection (register_functions), for filling the tables from
`memories` in one statement."""


def register_functions(conn: sqlite3.Connection) -> None:
    conn.create_function(INDEX_TEXT, 1, fts_text, deterministic=True)


def fts_text(text: str | None) -> str | None:
    """A text as the tables hold it: composed (NFC), as keywords.words() reads a question (text typed in another
    order of its marks, or decomposed, is found by the same word), its letters folded as PostgreSQL folds them
    (fold), then keywords.index_text's CJK pairs."""
    if text is None or text.isascii():
        return text if text is None else index_text(text)
    return index_text(fold(unicodedata.normalize("NFC", text)))


def fold(text: str) -> str:
    """Letters as PostgreSQL's `unaccent` writes them, where FTS5's tokenizer would keep them apart: full-width
    Latin letters and digits ("ｉＰｈｏｎｅ"), ligatures ("ﬁle"), Greek accents and breathings ("καφέ"), and the
    Latin letters that carry a stroke, a hook or a bar, or stand for two ("Łódź", "København", "Straße"). So a
    question typed without them finds the memory on both backends (README, "Search text"); the tokenizer still
    folds case and the other Latin accents itself. Applied to the indexed text and to the question's terms."""
    if text.isascii():
        return text
    table, foldable = _folds()
    return foldable.sub(lambda char: table[ord(char.group())], text)


@functools.cache
def _folds() -> tuple[dict[int, str], re.Pattern[str]]:
    """fold's table, made from the Unicode character database (tests/test_search_text.py compares it with
    PostgreSQL's unaccent, character by character), and the pattern of what it replaces: most text with accents has
    none of it (the tokenizer takes an ASCII letter's marks off itself), and a search of 250 characters costs
    2.5 us where str.translate with the table cost 20. Made at the first text that is not ASCII (13 ms), not when
    the store is imported."""
    table: dict[int, str] = {point: chr(point - 0xFEE0) for point in range(0xFF01, 0xFF5F)}  # full-width ASCII
    table |= {ord("ё"): "е", ord("Ё"): "Е"}  # the one Cyrillic letter unaccent folds
    latin = [*range(0xC0, 0x250), *range(0x1E00, 0x1F00), *range(0xFB00, 0xFB07)]
    greek = [*range(0x370, 0x400), *range(0x1F00, 0x2000)]
    for point in (*latin, *greek):
        char = chr(point)
        if not unicodedata.category(char).startswith("L"):
            continue
        decomposed = unicodedata.decomposition(char).split()
        canonical = bool(decomposed) and not decomposed[0].startswith("<")
        if point not in greek and canonical and int(decomposed[0], 16) < 0x80:
            continue  # an ASCII letter with marks ("é"): the tokenizer takes the marks off itself
        bare = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
        if bare and (point in greek or bare.isascii() and bare.isalpha()):
            if bare != char:
                table[point] = bare
            continue
        if canonical:  # another letter with a mark ("ǣ" is "æ" with a macron): unaccent leaves it
            continue
        named = _LATIN_NAME.fullmatch(unicodedata.name(char, ""))
        base = named and named.group(1)
        if base and (len(base) == 1 or base in _NAMED_LETTERS):
            table[point] = _NAMED_LETTERS.get(base, base).lower()
    return table, re.compile("[" + "".join(map(chr, sorted(table))) + "]")


_LATIN_NAME = re.compile(r"LATIN (?:SMALL|CAPITAL) (?:LETTER|LIGATURE) (.+?)(?: WITH .*)?")
_NAMED_LETTERS = {"AE": "ae", "OE": "oe", "IJ": "ij", "HV": "hv", "OI": "oi", "ETH": "d", "THORN": "th",
                  "SHARP S": "ss", "LONG S": "s", "KRA": "q", "ENG": "n", "DOTLESS I": "i", "DOTLESS J": "j",
                  "OPEN E": "e", "IOTA": "i", "AFRICAN D": "d", "U BAR": "u", "DB DIGRAPH": "db",
                  "QP DIGRAPH": "qp", "MIDDLE-WELSH LL": "ll", "MIDDLE-WELSH V": "v", "N PRECEDED BY APOSTROPHE": "n"}
"""Latin letters whose name is not "<letter> WITH <a mark>", folded as unaccent folds them."""


def _indexed(*texts: str) -> tuple[str, ...]:
    return tuple(fts_text(text) or "" for text in texts)


def table_names(tenant: str) -> tuple[str, str]:
    suffix = hashlib.sha256(tenant.encode()).hexdigest()[:24]
    return f"fts_{suffix}", f"ctx_{suffix}"


SECURE_DELETE = sqlite3.sqlite_version_info >= (3, 45, 0)
"""Whether this SQLite takes a deleted row's entries out of the index in place (FTS5's 'secure-delete' option, new in
3.42 and mended in the releases after it). Without it a deletion only adds a marker, and the row's words stay in
the index until a full merge ('optimize') rewrites the whole tenant's index: 75 ms at 20,000 rows, 320 ms at
100,000, holding the write lock (BENCHMARKS.md, "Erasure on SQLite"). With it, erasing one memory costs a few
milliseconds whatever the tenant's size; a large erasure still merges, which is cheaper than many in-place ones."""
READS_SECURE = sqlite3.sqlite_version_info >= (3, 42, 0)
"""Whether this SQLite can read an index that a newer one changed with in-place deletions (FTS5 marks it as format
5). An older one rebuilds such indexes from their rows when it opens the file (TenantIndexes.readable)."""
IN_PLACE_SHARE = 200
IN_PLACE_MIN = 16
"""An erasure takes entries out in place when it removes at most max(IN_PLACE_MIN, tenant rows // IN_PLACE_SHARE)
of a tenant's rows, else it merges: one in-place removal cost 0.6-0.9 ms and a full merge about 3.5 us per row of
the tenant at 20,000 and 100,000 rows (BENCHMARKS.md, "Erasure on SQLite")."""

REBUILD_EVERY = 200
"""A tenant's tables are rebuilt from its rows, instead of merged, once in this many scrubs. The full merge
('optimize') is what drops a deleted row's words from the index, but on older SQLite (3.40, the one Python ships
here) each one adds two levels to the index, and at 2,000 levels FTS5 reads its own index as "database disk image
is malformed". A rebuild starts again from one level, so no SQLite version can get there."""


class TenantIndexes:
    """Creates, fills, updates, scrubs and drops the per-tenant full-text tables through the store's query function."""

    def __init__(self, query: Query, many: Many) -> None:
        self._q = query
        self._many = many

    def names(self, tenant: str) -> tuple[str, str] | None:
        row = self._q("SELECT words, context FROM fts_tenants WHERE tenant = ?", (tenant,)).fetchone()
        return None if row is None else (row[0], row[1])

    def _create(self, tenant: str, migrating: bool = False) -> tuple[str, str]:
        """Empty tables for a tenant's first memory, whose deletions take entries out in place where this SQLite
        can. While migrating a file older than fts_tenants.secure and .rows, neither is set here: the first full
        merge turns in-place deletion on, and m015 counts the rows."""
        words, context = table_names(tenant)
        self._q(f"CREATE VIRTUAL TABLE IF NOT EXISTS {words} USING fts5(topic, content, owner_tag,"
                f" content='memories', content_rowid='pk', tokenize={_TOKENIZE})")
        self._q(f"CREATE VIRTUAL TABLE IF NOT EXISTS {context} USING fts5(topic, content, owner_tag, context,"
                f" content='memories', content_rowid='pk', tokenize={_TOKENIZE})")
        self._q("INSERT INTO fts_tenants (tenant, words, context) VALUES (?, ?, ?)", (tenant, words, context))
        if migrating:
            return words, context
        if SECURE_DELETE:
            self._in_place(words, context, True)
        self._q("UPDATE fts_tenants SET secure = ?, rows = (SELECT coalesce(sum(memories), 0) FROM owner_generation"
                " WHERE tenant = ?) WHERE tenant = ?", (int(SECURE_DELETE), tenant, tenant))
        return words, context

    def counted(self, owner_tenant: str, owner_user: str) -> tuple[str, str, int, int, float] | None:
        """The tenant's two tables, how many memories the owner has and how many the tenant has (the rows of its
        tables), and the highest confidence the owner's memories have had (MAX_CONFIDENCE when unknown), in one
        statement; None when the tenant has never stored a memory."""
        row = self._q("SELECT fts_tenants.words, fts_tenants.context, g.memories, fts_tenants.rows, g.most_confident"
                      " FROM fts_tenants"
                      " LEFT JOIN owner_generation g ON g.tenant = fts_tenants.tenant AND g.user_id = ?"
                      " WHERE fts_tenants.tenant = ?", (owner_user, owner_tenant)).fetchone()
        return None if row is None else (row[0], row[1], row[2] or 0, row[3],
                                         MAX_CONFIDENCE if row[4] is None else row[4])

    def _in_place(self, words: str, context: str, on: bool) -> None:
        """Turn FTS5's secure-delete on or off for a tenant's pair (stored in the tables' own settings)."""
        for name in (words, context):
            self._secure_delete(name, on)

    def _secure_delete(self, name: str, on: bool) -> None:
        self._q(f"INSERT INTO {name} ({name}, rank) VALUES ('secure-delete', ?)", (int(on),))

    def _fill(self, tenant: str, words: str, context: str) -> None:
        """Index every row the tenant has (the tables must hold none of them yet)."""
        self._q(f"INSERT INTO {words} (rowid, topic, content, owner_tag)"
                f" SELECT pk, {INDEX_TEXT}(topic), {INDEX_TEXT}(content), owner_tag FROM memories WHERE tenant = ?",
                (tenant,))
        self._q(f"INSERT INTO {context} (rowid, topic, content, owner_tag, context)"
                f" SELECT pk, {INDEX_TEXT}(topic), {INDEX_TEXT}(content), owner_tag, {INDEX_TEXT}(context)"
                " FROM memories WHERE tenant = ?", (tenant,))

    def index_existing(self, tenant: str) -> None:
        """Tables for a tenant whose rows were stored before tenants had their own (m004)."""
        self._fill(tenant, *self._create(tenant, migrating=True))

    def retokenize(self, tenant: str) -> None:
        """The tenant's tables made again with this TOKENIZER (a table's tokenizer is fixed when it is created), and
        filled from its rows."""
        if self.names(tenant) is None:
            return
        self.drop(tenant)
        self._fill(tenant, *self._create(tenant))

    def rebuild(self, tenant: str) -> None:
        """Index the tenant's rows afresh, with no deleted entry and no level left over. FTS5's own 'rebuild' would
        index the whole content table, which holds every tenant's rows."""
        names = self.names(tenant)
        if names is None:
            return
        for name in names:
            self._q(f"INSERT INTO {name} ({name}) VALUES ('delete-all')")
        self._fill(tenant, *names)
        self._q("UPDATE fts_tenants SET merges = 0 WHERE tenant = ?", (tenant,))

    def add(self, tenant: str, pk: int, topic: str, content: str, tag: str, context: str) -> None:
        self.add_many(tenant, [(pk, topic, content, tag, context)])

    def add_many(self, tenant: str, rows: Sequence[tuple[int, str, str, str, str]]) -> None:
        """Index rows (pk, topic, content, owner_tag, context) of one tenant.

        A batch is indexed after its memories rows are written, not row by row between them: any statement that
        opens a savepoint (one that fires a trigger does) makes FTS5 write out the entries it holds in memory, so
        indexing between the rows wrote one small segment per row (BENCHMARKS.md, "Ingest into SQLite")."""
        if not rows:
            return
        words, ctx = self.names(tenant) or self._create(tenant)
        entries = [(pk, *_indexed(topic, content, context), tag) for pk, topic, content, tag, context in rows]
        self._many(f"INSERT INTO {words} (rowid, topic, content, owner_tag) VALUES (?, ?, ?, ?)",
                   [(pk, topic, content, tag) for pk, topic, content, _context, tag in entries])
        self._many(f"INSERT INTO {ctx} (rowid, topic, content, context, owner_tag) VALUES (?, ?, ?, ?, ?)", entries)

    def remove(self, rows: Iterable[Sequence]) -> set[str]:
        """Take rows (tenant, pk, topic, content, owner_tag, context) out of their tenant's tables; returns the
        tenants touched. A tenant whose deletions are in place keeps them so for a few rows; for more (see
        IN_PLACE_SHARE) it leaves markers instead, and scrub() merges."""
        by_tenant: dict[str, list[Sequence]] = {}
        for row in rows:
            by_tenant.setdefault(row[0], []).append(row)
        touched: set[str] = set()
        for tenant, doomed in by_tenant.items():
            found = self._q("SELECT words, context, secure, rows FROM fts_tenants WHERE tenant = ?",
                            (tenant,)).fetchone()
            if found is None:
                continue
            touched.add(tenant)
            words, ctx, secure, tenant_rows = found
            in_place = secure and SECURE_DELETE and len(doomed) <= max(IN_PLACE_MIN, tenant_rows // IN_PLACE_SHARE)
            if in_place:
                self._in_place(words, ctx, True)  # as the column says, whatever was done to the tables' settings
            elif secure:
                self._in_place(words, ctx, False)
                self._q("UPDATE fts_tenants SET secure = 0 WHERE tenant = ?", (tenant,))
            for _tenant, pk, topic, content, tag, context in doomed:
                topic, content, context = _indexed(topic, content, context)
                self._q(f"INSERT INTO {words} ({words}, rowid, topic, content, owner_tag)"
                        " VALUES ('delete', ?, ?, ?, ?)", (pk, topic, content, tag))
                self._q(f"INSERT INTO {ctx} ({ctx}, rowid, topic, content, owner_tag, context)"
                        " VALUES ('delete', ?, ?, ?, ?, ?)", (pk, topic, content, tag, context))
        return touched

    def replace_context(self, tenant: str, pk: int, topic: str, content: str, tag: str, old: str, new: str) -> None:
        """A row's conversation context replaced in the tenant's context table. Where this SQLite deletes in place,
        the old entries are taken out in place even while a bulk erasure has turned that off (it merges at its end):
        a row deleted by marker and indexed again under the same key before the merge kept, in the merged index,
        an entry that a later in-place deletion of the row left behind, so the row's words stayed in the file after
        it was forgotten (found by a test that scans the file's bytes)."""
        found = self._q("SELECT context, secure FROM fts_tenants WHERE tenant = ?", (tenant,)).fetchone()
        if found is None:
            return
        ctx, secure = found
        topic, content, old, new = _indexed(topic, content, old, new)
        switched = SECURE_DELETE and not secure
        if switched:
            self._secure_delete(ctx, True)
        self._q(f"INSERT INTO {ctx} ({ctx}, rowid, topic, content, owner_tag, context)"
                " VALUES ('delete', ?, ?, ?, ?, ?)", (pk, topic, content, tag, old))
        if switched:
            self._secure_delete(ctx, False)
        self._q(f"INSERT INTO {ctx} (rowid, topic, content, owner_tag, context) VALUES (?, ?, ?, ?, ?)",
                (pk, topic, content, tag, new))

    def drop(self, tenant: str) -> None:
        names = self.names(tenant)
        if names is None:
            return
        for name in names:
            self._q(f"DROP TABLE IF EXISTS {name}")
        self._q("DELETE FROM fts_tenants WHERE tenant = ?", (tenant,))

    def scrub(self, tenants: Iterable[str]) -> None:
        """Drop deleted entries from the touched tenants' indexes for good. Where deletions were in place there is
        nothing left to drop; elsewhere a full merge of each index, or, every REBUILD_EVERY times, a rebuild from the
        tenant's rows (see REBUILD_EVERY). Then, where this SQLite can, deletions are in place from now on."""
        for tenant in tenants:
            row = self._q("SELECT words, context, merges, secure FROM fts_tenants WHERE tenant = ?",
                          (tenant,)).fetchone()
            if row is None or row[3]:
                continue
            if row[2] + 1 >= REBUILD_EVERY:
                self.rebuild(tenant)
            else:
                for name in row[:2]:
                    self._q(f"INSERT INTO {name} ({name}) VALUES ('optimize')")
                self._q("UPDATE fts_tenants SET merges = merges + 1 WHERE tenant = ?", (tenant,))
            if SECURE_DELETE:
                self._in_place(row[0], row[1], True)
                self._q("UPDATE fts_tenants SET secure = 1 WHERE tenant = ?", (tenant,))

    def readable(self) -> None:
        """On an SQLite older than READS_SECURE, undo what a newer one set for in-place deletion. Its tables lose the
        secure-delete setting; those it changed in place, which this SQLite can neither read nor drop (format 5),
        get the old format mark back and are filled again from the tenant's rows (nothing of their old index is
        kept). Tables it never deleted from in place are read as they are."""
        if READS_SECURE:
            return
        for tenant, words, context in self._q("SELECT tenant, words, context FROM fts_tenants WHERE secure = 1"
                                              ).fetchall():
            changed = False
            for name in (words, context):
                changed |= self._q(f"UPDATE {name}_config SET v = 4 WHERE k = 'version' AND v > 4").rowcount > 0
                self._q(f"DELETE FROM {name}_config WHERE k = 'secure-delete'")
            self._q("UPDATE fts_tenants SET secure = 0 WHERE tenant = ?", (tenant,))
            if changed:
                self.rebuild(tenant)
