"""The registry of per-owner tables: the one list that erase, owners(), a tenant's user list, purge, stats,
export/import, migrate's copy and verify, and PostgreSQL's row-level security read. Adding an owner table is one
entry here plus its DDL (a migration per backend; on PostgreSQL, `_postgres_schema.tenant_wall` gives it the same
wall as the others).

A table's rows are kept by one half of the store contract: `memories` and `memory_pieces` by the memory-and-search
half (each backend indexes them its own way, so each deletes their rows its own way; pieces go with their memory,
by foreign key), every other table by the records half, written once over both SQL dialects (sql_records.py).
Tables a backend derives from these (SQLite's owner_generation counters, its per-tenant full-text tables,
PostgreSQL's memory_words) are not listed: they are not exported or copied, and the backend erases them with their
owner.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OwnerTable:
    """One table whose rows belong to an owner.

    owner: the columns that say whose a row is: (tenant, user_id) for an owner's records, (tenant,) for what
        belongs to a whole tenant (API keys).
    kind: the export record kind its rows are written as (exports.py), None when they are not exported.
    counted_as: the field of Erased, and the key of the migration report, its rows count in (None: not counted).
    in_stats: whether Store.stats() reports how many rows it has (under counted_as).
    erased: whether erase_user/erase_tenant delete its rows (API keys are revoked instead, and stay listed).
    expires: whether it has an expires_at that purge_expired deletes by.
    records: kept by the records half (sql_records.py); False for the memory-and-search half's table.
    walled: whether PostgreSQL walls it with row-level security on tenant (every owner table is).
    """

    name: str
    owner: tuple[str, ...] = ("tenant", "user_id")
    kind: str | None = None
    counted_as: str | None = None
    in_stats: bool = False
    erased: bool = True
    expires: bool = False
    records: bool = True
    walled: bool = True

    @property
    def per_user(self) -> bool:
        """Whether rows name a user too: such a table says who the store's owners are (owners())."""
        return "user_id" in self.owner


OWNER_TABLES: tuple[OwnerTable, ...] = (
    OwnerTable("memories", kind="memory", counted_as="memories", in_stats=True, expires=True, records=False),
    OwnerTable("memory_pieces", records=False),  # a long memory's later pieces' vectors, deleted with the memory
    OwnerTable("facts", kind="fact", counted_as="facts", in_stats=True),
    OwnerTable("fact_history", kind="fact_change", counted_as="fact_changes"),
    OwnerTable("messages", kind="message", counted_as="messages", in_stats=True, expires=True),
    OwnerTable("learned_from", kind="evidence"),
    OwnerTable("learn_marks", kind="learn_mark"),
    OwnerTable("api_keys", owner=("tenant",), erased=False),
)
"""Every per-owner table, in the order records are erased, exported, copied and verified."""


def table(name: str) -> OwnerTable:
    """The registry entry of a table."""
    for entry in OWNER_TABLES:
        if entry.name == name:
            return entry
    raise KeyError(name)


def erased_tables() -> tuple[OwnerTable, ...]:
    """Tables whose rows erase_user and erase_tenant delete."""
    return tuple(t for t in OWNER_TABLES if t.erased)


def record_tables() -> tuple[OwnerTable, ...]:
    """Tables of the records half that erasure deletes from, in order."""
    return tuple(t for t in OWNER_TABLES if t.erased and t.records)


def expiring_record_tables() -> tuple[OwnerTable, ...]:
    """Tables of the records half whose expired rows purge_expired deletes."""
    return tuple(t for t in OWNER_TABLES if t.expires and t.records)


def owner_listing_sql() -> str:
    """Every (tenant, user_id) with a row in any per-user table, sorted; the same SQL on every backend."""
    selects = " UNION ".join(f"SELECT tenant, user_id FROM {t.name}" for t in OWNER_TABLES if t.per_user)
    return f"{selects} ORDER BY 1, 2"


def listed_user_tables() -> tuple[OwnerTable, ...]:
    """The tables whose live rows (those not expired) make a user one of the tenant's users (Store.page_users): the
    per-user tables an export reads, so a user is listed exactly while an export of them holds a record."""
    return tuple(t for t in OWNER_TABLES if t.per_user and t.kind)


def stats_sql() -> tuple[str, tuple[str, ...]]:
    """One query counting the rows of each table stats() reports, and the names its columns are reported by."""
    counted = [t for t in OWNER_TABLES if t.in_stats and t.counted_as]
    return ("SELECT " + ", ".join(f"(SELECT count(*) FROM {t.name})" for t in counted),
            tuple(t.counted_as for t in counted if t.counted_as))


def exported_kinds() -> tuple[str, ...]:
    """The export record kinds, in the order an export writes them."""
    return tuple(t.kind for t in OWNER_TABLES if t.kind)


def counted_by_kind() -> dict[str, str]:
    """Each export record kind's count name (memory -> memories): how migrate's verification reports counts."""
    return {t.kind: t.counted_as for t in OWNER_TABLES if t.kind and t.counted_as}


def walled_tables() -> tuple[str, ...]:
    """Names of the tables PostgreSQL walls with row-level security."""
    return tuple(t.name for t in OWNER_TABLES if t.walled)
