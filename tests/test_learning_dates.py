"""Relative dates resolved against when they were said: a table of phrases and days, the edges (month and year
ends, leap days, Sunday and Monday), and what must stay as it is."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memshelf import Owner, Shelf
from memshelf.learning.dates import resolve_dates


def said(day: str) -> datetime:
    return datetime.fromisoformat(day + "T10:00:00+00:00")


WED = "2026-05-20"  # a Wednesday, in spring
RESOLVED = [
    # (said on, text, resolved)
    (WED, "I moved to Lisbon last spring.", "I moved to Lisbon last spring (spring 2025)."),
    (WED, "My dentist appointment is tomorrow.", "My dentist appointment is tomorrow (2026-05-21)."),
    (WED, "Today is my day off.", "Today (2026-05-20) is my day off."),
    (WED, "We're having sushi tonight", "We're having sushi tonight (2026-05-20)"),
    (WED, "I started a new job yesterday.", "I started a new job yesterday (2026-05-19)."),
    (WED, "the day before yesterday I was sick", "the day before yesterday (2026-05-18) I was sick"),
    (WED, "The party is the day after tomorrow.", "The party is the day after tomorrow (2026-05-22)."),
    (WED, "I slept badly last night.", "I slept badly last night (2026-05-19)."),
    (WED, "I ran 5k this morning.", "I ran 5k this morning (2026-05-20)."),
    (WED, "I adopted her 3 days ago.", "I adopted her 3 days ago (2026-05-17)."),
    (WED, "I quit two weeks ago.", "I quit two weeks ago (2026-05-06)."),
    (WED, "I got engaged a couple of months ago.", "I got engaged a couple of months ago (March 2026)."),
    (WED, "We married ten years ago.", "We married ten years ago (2016)."),
    (WED, "I broke my arm a year ago.", "I broke my arm a year ago (2025)."),
    (WED, "I was in Rome last week.", "I was in Rome last week (week of 2026-05-11)."),
    (WED, "I'm busy this week.", "I'm busy this week (week of 2026-05-18)."),
    (WED, "I fly out next week.", "I fly out next week (week of 2026-05-25)."),
    (WED, "I turned 40 last month.", "I turned 40 last month (April 2026)."),
    (WED, "The lease ends next month.", "The lease ends next month (June 2026)."),
    (WED, "I graduated last year.", "I graduated last year (2025)."),
    (WED, "I retire next year", "I retire next year (2027)"),
    (WED, "We met last Monday.", "We met last Monday (2026-05-18)."),
    (WED, "We meet next Monday.", "We meet next Monday (2026-05-25)."),
    (WED, "Last Friday I got a puppy.", "Last Friday (2026-05-15) I got a puppy."),
    (WED, "My sister visits next Wednesday.", "My sister visits next Wednesday (2026-05-27)."),
    (WED, "I'll call the plumber on Friday.", "I'll call the plumber on Friday (2026-05-22)."),
    (WED, "I went to the dentist on Monday.", "I went to the dentist on Monday (2026-05-18)."),
    (WED, "On Monday I met Ana.", "On Monday (2026-05-18) I met Ana."),
    (WED, "We're going to Porto next summer.", "We're going to Porto next summer (summer 2026)."),
    (WED, "Last autumn I changed jobs.", "Last autumn (autumn 2025) I changed jobs."),
    (WED, "It snowed a lot last winter.", "It snowed a lot last winter (winter 2025/26)."),
    (WED, "This spring has been wet.", "This spring (spring 2026) has been wet."),
    (WED, "We went to Oslo last fall.", "We went to Oslo last fall (fall 2025)."),
    (WED, "I moved here in March.", "I moved here in March (March 2026)."),
    (WED, "I met her in September.", "I met her in September (September 2025)."),
    (WED, "Tomorrow's meeting is moved.", "Tomorrow's (2026-05-21) meeting is moved."),
    # month and year ends
    ("2026-01-01", "I slept in yesterday.", "I slept in yesterday (2025-12-31)."),
    ("2025-12-31", "The trip is tomorrow.", "The trip is tomorrow (2026-01-01)."),
    ("2026-01-15", "I started last month.", "I started last month (December 2025)."),
    ("2025-12-02", "We move next month.", "We move next month (January 2026)."),
    ("2026-03-31", "I joined a month ago.", "I joined a month ago (February 2026)."),
    ("2026-01-10", "I got sick last week.", "I got sick last week (week of 2025-12-29)."),
    ("2026-01-10", "I moved in December.", "I moved in December (December 2025)."),
    # leap years
    ("2024-03-01", "I flew home yesterday.", "I flew home yesterday (2024-02-29)."),
    ("2024-02-28", "My exam is the day after tomorrow.", "My exam is the day after tomorrow (2024-03-01)."),
    ("2023-02-28", "My exam is tomorrow.", "My exam is tomorrow (2023-03-01)."),
    ("2024-02-29", "I joined 365 days ago.", "I joined 365 days ago (2023-03-01)."),
    # Sunday and Monday edges (weeks run Monday to Sunday)
    ("2026-05-24", "I was in Rome last week.", "I was in Rome last week (week of 2026-05-11)."),
    ("2026-05-24", "I'm off this week.", "I'm off this week (week of 2026-05-18)."),
    ("2026-05-25", "I was in Rome last week.", "I was in Rome last week (week of 2026-05-18)."),
    ("2026-05-25", "We met last Monday.", "We met last Monday (2026-05-18)."),
    ("2026-05-25", "We meet next Monday.", "We meet next Monday (2026-06-01)."),
    ("2026-05-24", "We met last Sunday.", "We met last Sunday (2026-05-17)."),
    ("2026-05-24", "We meet next Monday.", "We meet next Monday (2026-05-25)."),
    # seasons around their edges (meteorological, northern hemisphere)
    ("2026-06-01", "I moved to Lisbon last spring.", "I moved to Lisbon last spring (spring 2026)."),
    ("2026-05-31", "I moved to Lisbon last spring.", "I moved to Lisbon last spring (spring 2025)."),
    ("2026-02-10", "It was cold last winter.", "It was cold last winter (winter 2024/25)."),
    ("2026-03-10", "It was cold last winter.", "It was cold last winter (winter 2025/26)."),
    ("2026-01-10", "We ski this winter.", "We ski this winter (winter 2025/26)."),
    ("2026-10-10", "We ski this winter.", "We ski this winter (winter 2026/27)."),
    ("2026-03-20", "This winter was long.", "This winter (winter 2025/26) was long."),
    ("2026-01-10", "We marry next summer.", "We marry next summer (summer 2026)."),
    ("2026-07-10", "We marry next summer.", "We marry next summer (summer 2027)."),
    ("2026-12-10", "We ski next winter.", "We ski next winter (winter 2027/28)."),
]


@pytest.mark.parametrize("day, text, expected", RESOLVED, ids=[f"{d} {t}" for d, t, _ in RESOLVED])
def test_relative_dates_are_resolved_against_when_they_were_said(day, text, expected):
    assert resolve_dates(text, said(day)) == expected


UNCHANGED = [
    "Are you watching Monday Night Football?",
    "I love Monday's special at the diner.",
    "It will be a year ago tomorrow that we met.",  # two phrases side by side mean a third: left alone
    "The opening is tomorrow next week, I think.",
    "I have a meeting on Monday.",  # neither plainly past nor future
    "I was told the launch will be on Monday.",  # both
    "My friend March is coming over.",
    "I confided in March about it.",  # a name after "in", but no past or future marker
    "My birthday is in March.",  # when in March? the next one or the last? nothing says
    "I will move in March.",  # future months are not resolved either: this March or next?
    "I moved in March 2024.",  # already absolute
    "I moved in March of 2019.",
    "We went to the March Madness final.",
    "I met her this Monday.",  # this week's, or the coming one?
    "I get there in a few days.",
    "These days I mostly cook at home.",
    "I work Mondays and Tuesdays.",
    "I was born 0 days ago.",
    "The deadline is tomorrow (the 21st).",  # the user's own parenthesis
    "",
]


@pytest.mark.parametrize("text", UNCHANGED)
def test_what_is_ambiguous_or_not_a_date_is_left_alone(text):
    assert resolve_dates(text, said(WED)) == text


def test_nothing_changes_without_a_time_and_resolving_twice_changes_nothing():
    text = "I moved to Lisbon last spring, started work yesterday and fly home next Friday."
    assert resolve_dates(text, None) == text
    once = resolve_dates(text, said(WED))
    assert once == ("I moved to Lisbon last spring (spring 2025), started work yesterday (2026-05-19) and fly home "
                    "next Friday (2026-05-22).")
    assert resolve_dates(once, said(WED)) == once
    assert resolve_dates(once, said("2027-01-01")) == once


def test_only_the_phrase_is_annotated_everything_else_is_kept():
    text = "  Yesterday,\tI moved.\nTOMORROW  I leave!  "
    resolved = resolve_dates(text, said(WED))
    assert resolved == "  Yesterday (2026-05-19),\tI moved.\nTOMORROW (2026-05-21)  I leave!  "
    assert resolved.replace(" (2026-05-19)", "").replace(" (2026-05-21)", "") == text


def test_the_day_is_the_one_in_the_timezone_it_was_said_in():
    late = datetime.fromisoformat("2026-05-20T23:30:00-05:00")  # already the 21st in UTC
    assert resolve_dates("It is due tomorrow.", late) == "It is due tomorrow (2026-05-21)."


def test_a_learned_memory_stores_the_date_it_means(tmp_path):
    monday = datetime(2026, 5, 18, 9, 0, tzinfo=UTC)
    alice = Owner("acme", "alice")
    with Shelf.open(tmp_path / "m.db", embedder=None, clock=lambda: monday) as shelf:
        shelf.log_message(alice, "t1", "user", "Please remember that my dentist appointment is tomorrow.")
        shelf.log_message(alice, "t1", "user", "I moved to Lisbon last spring.")
        plan = shelf.learn(alice, thread="t1")
        contents = [hit.memory.content for hit in shelf.search(alice, "dentist appointment")]
        facts = {f.key: f.value for f in shelf.facts(alice)}
    assert contents == ["My dentist appointment is tomorrow (2026-05-19)"]
    assert facts["home_city"] == "Lisbon"  # a value without a relative phrase is stored as it is
    assert all(p.at == monday for p in plan.applied)
