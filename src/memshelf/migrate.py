"""Copy everything from one store to another (`memshelf migrate SOURCE DEST`), e.g. SQLite to PostgreSQL.

Every owner's memories (with vectors, a long memory's pieces' vectors too, model stamps, ids, times and observation
counts), facts with their history, and messages are copied in batches, each batch its own transaction. It is
resumable: the import methods skip ids and texts the destination already has, and fact history is copied only
where missing, so running it again after an interruption finishes the job. At the end each owner is verified on
both sides by counts and a sha256 over its sorted records; a difference raises MigrationMismatch.

Two things are refused before anything is created or written: a source that is not a memshelf store (a SQLite
path that does not exist, a PostgreSQL database without memshelf's tables), and a destination that already holds
records of a source owner which this migration did not put there (MigrationConflict). What a previous, interrupted
run copied is told apart by content: every destination record of that owner is one of the source's records,
identical field by field. Anything else (another id, text, count or fact value) is someone else's data.

API keys are copied with their hashes (secrets are never known), revoked ones included.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Sequence

from .errors import MemshelfError
from .model import Owner, missing_changes
from .exports import EVERYTHING, canonical_line, owner_records
from .stores.base import Store, open_store
from .stores.registry import check_existing_store
from .stores.tables import OWNER_TABLES, counted_by_kind, exported_kinds

DEFAULT_BATCH = 1_000
Progress = Callable[[int, int], None]
"""progress(records_done, records_total), called after every batch."""


class MigrationMismatch(MemshelfError):
    """After copying, an owner's records differ between source and destination."""


class MigrationConflict(MemshelfError):
    """The destination already holds records of a source owner that this migration did not write."""


MAX_NAMED_OWNERS = 10


@dataclass(frozen=True)
class OwnerCheck:
    owner: Owner
    counts: dict[str, int]
    checksum: str


@dataclass
class MigrationReport:
    owners: int = 0
    copied: Counter = field(default_factory=Counter)  # what was new in the destination, by kind
    checked: list[OwnerCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        # a list, not a map keyed by "tenant/user": a '/' inside a tenant or a user made two owners one key
        return {"owners": self.owners, "copied": dict(self.copied), "notes": self.notes,
                "verified": [{"tenant": c.owner.tenant, "user": c.owner.user, **c.counts, "sha256": c.checksum}
                             for c in self.checked]}


def migrate(source: str, dest: str, *, batch: int = DEFAULT_BATCH, progress: Progress | None = None
            ) -> MigrationReport:
    """Open both targets (paths or URLs, as Shelf.open takes them), copy, verify, close."""
    if source == dest or _same_file(source, dest):
        raise MemshelfError(f"source and destination are both {source!r}: name two different stores")
    check_source(source)
    src = open_store(source)
    try:
        dst = open_store(dest)
        try:
            return copy_store(src, dst, batch=batch, progress=progress)
        finally:
            dst.close()
    finally:
        src.close()


def copy_store(source: Store, dest: Store, *, batch: int = DEFAULT_BATCH,
               progress: Progress | None = None) -> MigrationReport:
    """Copy every owner's records and the API keys from source to dest, then verify both sides agree."""
    if batch < 1:
        raise MemshelfError(f"batch must be at least 1, got {batch}")
    report = MigrationReport()
    owners = source.owners()
    report.owners = len(owners)
    _refuse_conflicts(source, dest, owners)
    stats = source.stats()
    total = sum(stats.get(t.counted_as, 0) for t in OWNER_TABLES if t.in_stats and t.counted_as)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, max(total, done))

    with dest.bulk_load():
        for owner in owners:
            _copy_owner(source, dest, owner, batch, report, advance)
    _copy_keys(source, dest, report)
    for owner in owners:
        report.checked.append(_verify(source, dest, owner))
    return report


# ---------------------------------------------------------------- refusals, before anything is written
def check_source(target: str) -> None:
    """Refuse a source that is not a memshelf store, before opening it: opening a store creates it (a new SQLite
    file, memshelf's tables and roles in a PostgreSQL database), which a source must never be. Each backend says
    what an existing store of its own is (its provider's `check_existing` hook); one without the hook is opened as
    it is."""
    check_existing_store(target)


def _refuse_conflicts(source: Store, dest: Store, owners: Sequence[Owner]) -> None:
    """Refuse, before writing, when the destination holds records of a source owner that are not a previous run of
    this migration (see the module docstring)."""
    clashes = [owner for owner in owners if not _is_earlier_copy(source, dest, owner)]
    if not clashes:
        return
    named = ", ".join(str(o) for o in clashes[:MAX_NAMED_OWNERS])
    more = f" and {len(clashes) - MAX_NAMED_OWNERS} more" if len(clashes) > MAX_NAMED_OWNERS else ""
    raise MigrationConflict(
        f"the destination already holds records of {len(clashes)} source owner(s) that this migration did not "
        f"write: {named}{more}. Nothing was copied. Erase those owners in the destination (memshelf --db DEST "
        "--tenant T --user U forget-user --yes), or migrate into another, empty destination. (What an interrupted "
        "run of this same migration copied is not a conflict: rerunning it finishes the job.)")


def _is_earlier_copy(source: Store, dest: Store, owner: Owner) -> bool:
    """Whether every record the destination has of this owner is one of the source's, identical (as a multiset:
    fact history has no ids). The source is read only for owners the destination already has records of."""
    present = owner_lines(dest, owner)
    if not any(present.values()):
        return True
    wanted = owner_lines(source, owner)
    return all(not Counter(lines) - Counter(wanted[kind]) for kind, lines in present.items())


def _copy_owner(source: Store, dest: Store, owner: Owner, batch: int, report: MigrationReport,
                advance: Callable[[int], None]) -> None:
    for chunk in _chunks(source.iter_memories(owner, None), batch):
        memories = [m for m, _ in chunk]
        pieces = source.memory_pieces(owner, [m.id for m in memories])  # a long memory's later pieces go along
        report.copied["memories"] += dest.import_memories(owner, memories, [v for _, v in chunk],
                                                          [pieces.get(m.id, []) for m in memories])
        advance(len(chunk))
    facts = source.facts(owner)
    missing = missing_changes(source.fact_history(owner, None), dest.fact_history(owner, None))
    report.copied["facts"] += dest.import_facts(owner, list(reversed(facts)), missing)
    report.copied["fact_changes"] += len(missing)
    advance(len(facts))
    for chunk in _chunks(iter(source.messages(owner, None, EVERYTHING, None)), batch):
        report.copied["messages"] += dest.import_messages(owner, chunk)
        advance(len(chunk))
    _copy_learning(source, dest, owner, report)


def _copy_learning(source: Store, dest: Store, owner: Owner, report: MigrationReport) -> None:
    """The evidence of learned records (what the destination lacks, as fact history) and the watermarks."""
    evidence = missing_changes(source.evidence(owner, None, None), dest.evidence(owner, None, None))
    if evidence:
        dest.add_evidence(owner, evidence)
        report.copied["evidence"] += len(evidence)
    present = dest.learn_marks(owner)
    for thread, mark in source.learn_marks(owner).items():
        if thread not in present:
            dest.set_learn_mark(owner, thread, mark, mark.said_at)
            report.copied["learn_marks"] += 1



def _same_file(source: str, dest: str) -> bool:
    """Whether two SQLite paths name one file (./memory.db and memory.db, a path and its absolute form)."""
    if "://" in source or "://" in dest or ":memory:" in (source, dest):
        return False
    return Path(source).expanduser().resolve() == Path(dest).expanduser().resolve()


def _copy_keys(source: Store, dest: Store, report: MigrationReport) -> None:
    present = {k.id: k for k in dest.list_keys(None)}
    for key, secret_hash in source.api_keys():
        there = present.get(key.id)
        if there is not None:  # copied by an earlier run: a revocation since then goes too (a key never revives)
            if key.revoked_at is not None and there.revoked_at is None:
                dest.revoke_key(key.id, key.revoked_at)
            continue
        dest.add_key(key, secret_hash)
        if key.revoked_at is not None:
            dest.revoke_key(key.id, key.revoked_at)
        report.copied["api_keys"] += 1


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# ---------------------------------------------------------------- verification
def owner_lines(store: Store, owner: Owner) -> dict[str, list[str]]:
    """The owner's records (expired ones too) by kind, in the registry's order, each as one canonical JSON line of
    the export format, sorted so that insertion order does not matter: what verification hashes and what the
    conflict check compares. A kind the copy forgot shows up here as a mismatch."""
    return {kind: sorted(canonical_line(record) for record in owner_records(store, owner, kind, None))
            for kind in exported_kinds()}


def owner_check(store: Store, owner: Owner) -> OwnerCheck:
    """Counts and a sha256 over the owner's records, sorted so that insertion order does not matter."""
    lines = owner_lines(store, owner)
    digest = hashlib.sha256()
    for kind, records in lines.items():
        for line in records:
            digest.update(f"{kind}\t{line}\n".encode())
    names = counted_by_kind()
    counts = {names.get(kind, kind): len(records) for kind, records in lines.items() if kind in names or records}
    return OwnerCheck(owner, counts, digest.hexdigest())


def _verify(source: Store, dest: Store, owner: Owner) -> OwnerCheck:
    want, got = owner_check(source, owner), owner_check(dest, owner)
    if want.counts != got.counts or want.checksum != got.checksum:
        raise MigrationMismatch(
            f"after copying, {owner} differs: source has {want.counts} (sha256 {want.checksum[:12]}), destination "
            f"has {got.counts} (sha256 {got.checksum[:12]}). If the copy was interrupted, run the migration again "
            "to resume; if the destination already held other records for this owner, migrate into an empty "
            "destination")
    return got
