"""Relative dates resolved against when they were said: "I moved to Lisbon last spring", said on 2026-05-20,
becomes "I moved to Lisbon last spring (spring 2025)".

The user's words are kept; the absolute date is added after the phrase, in parentheses. Nothing else in the text
changes, and a phrase already followed by a parenthesis is left as it is, so resolving twice changes nothing.
A phrase is resolved only when its meaning is settled by the rules below; when unsure, the text is left alone.

What each phrase means (D is the calendar day it was said, in the timezone `said_at` carries):
- today, tonight, this morning / afternoon / evening: D. yesterday, last night: D - 1. tomorrow: D + 1.
  the day before yesterday: D - 2. the day after tomorrow: D + 2.
- N days ago: D - N; N weeks ago: D - 7N (both as a date). N months ago: the month N months before D's month;
  N years ago: the year. N is a number (1 to 999), a/an/one to twelve, or "a couple of" (2); "a few" is left.
- last / this / next week: weeks run Monday to Sunday (ISO), shown as "week of" their Monday; "this week" is the
  one holding D. last / this / next month and year: the calendar month or year before, holding or after D's.
- last Monday..Sunday: the most recent such day strictly before D (said on a Monday, "last Monday" is a week
  ago). next Monday..Sunday: the first such day strictly after D. Both readings are the common ones but not the
  only ones ("next Friday" may mean the Friday of next week): a caller who needs the other reading sees the date.
  "this Monday" is left alone (this week's? the coming one?).
- on Monday..Sunday: only when the sentence's tense is plain: a future marker (will, 'll, shall, going to, gonna)
  and no past one: the first such day strictly after D; a past marker (was, were, did, had, went, ...) and no
  future one: the most recent such day strictly before D. Otherwise left alone.
- Seasons are northern-hemisphere meteorological: spring March-May, summer June-August, autumn (fall)
  September-November, winter December-February (shown as "winter 2025/26"). last S: the most recent S that had
  ended before D (said in May 2026, "last spring" is spring 2025). next S: the first S that starts after D. this S:
  the S holding D, else the nearer of the one just ended and the one to come ("this winter", said in March, is
  the winter just ended; said in October, the coming one).
- in January..December: only with a past marker and no future one, and not followed by a year or a possessive:
  the most recent such month up to D's month ("I moved here in March", said in May 2026: March 2026).
- Two relative phrases side by side ("a year ago tomorrow", "tomorrow next week") are left alone: together they
  mean something neither says alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime, timedelta

__all__ = ["resolve_dates"]

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2}
SEASON_START = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
"""The month each meteorological season starts in; each lasts three months."""

_DAY_SHIFT = {"today": 0, "tonight": 0, "this morning": 0, "this afternoon": 0, "this evening": 0,
              "yesterday": -1, "last night": -1, "tomorrow": 1, "the day before yesterday": -2,
              "the day after tomorrow": 2}
_SHIFT = {"last": -1, "this": 0, "next": 1}

_COUNT = r"(?P<n>\d{1,3}|(?:a )?couple of|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_WEEKDAY = "|".join(WEEKDAYS)
_SEASON = "|".join(SEASON_START)
_MONTH = "|".join(MONTHS)
_CAPITALISED_NEXT = r"(?!\s+(?-i:(?!I\b)[A-Z]))"  # "Monday Night Football", "March Madness" (but "On Monday I")
_NOT_A_NAME = r"(?!['’]s\b)" + _CAPITALISED_NEXT
_PHRASE = re.compile(
    r"\b(?:"
    r"(?P<day>the day before yesterday|the day after tomorrow|today|tonight|yesterday|tomorrow|last night|"
    r"this (?:morning|afternoon|evening))"
    r"|" + _COUNT + r" (?P<unit>day|week|month|year)s? ago"
    r"|(?P<rel>last|this|next) (?P<span>week|month|year)"
    r"|(?P<wrel>last|next) (?P<weekday>" + _WEEKDAY + r")" + _NOT_A_NAME +
    r"|on (?P<onday>" + _WEEKDAY + r")" + _NOT_A_NAME +
    r"|(?P<srel>last|this|next) (?P<season>" + _SEASON + r")"
    r"|in (?P<month>(?-i:" + "|".join(m.capitalize() for m in MONTHS) + r"))(?!['’]s\b)(?!,? \d| of\b)"
    + _CAPITALISED_NEXT +
    r")\b(?P<poss>['’]s\b)?",
    re.IGNORECASE)
_RESOLVED = re.compile(r"\s*\(")
_ADJACENT = re.compile(r"[ \t]*")
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)|\n")
_FUTURE = re.compile(r"\b(?:will|shall|going to|gonna)\b|['’]ll\b", re.IGNORECASE)
_PAST = re.compile(r"\b(?:was|were|did|had|went|came|got|met|saw|left|told|said|spent|took|bought|moved|started|"
                   r"visited|finished|ended|happened|arrived|returned|traveled|travelled)\b", re.IGNORECASE)


def resolve_dates(text: str, said_at: datetime | None) -> str:
    """The text with each relative date it can settle followed by the absolute date in parentheses; unchanged
    when `said_at` is None or nothing is settled. See the module's docstring for what each phrase means."""
    if said_at is None or not text:
        return text
    day = said_at.date()
    matches = [m for m in _PHRASE.finditer(text) if not _RESOLVED.match(text, m.end())]
    lonely = _apart(text, matches)
    pieces: list[str] = []
    done = 0
    for match in lonely:
        absolute = _absolute(match, day, _sentence(text, match))
        if absolute is not None:
            pieces += [text[done:match.end()], f" ({absolute})"]
            done = match.end()
    return "".join(pieces) + text[done:] if pieces else text


def _apart(text: str, matches: list[re.Match[str]]) -> list[re.Match[str]]:
    """The matches not right next to another one ("a year ago tomorrow" is two phrases that mean a third)."""
    joined = set()
    for first, second in zip(matches, matches[1:], strict=False):
        if _ADJACENT.fullmatch(text, first.end(), second.start()):
            joined |= {first.start(), second.start()}
    return [m for m in matches if m.start() not in joined]


def _sentence(text: str, match: re.Match[str]) -> str:
    starts = [0] + [end.end() for end in _SENTENCE_END.finditer(text, 0, match.start())]
    after = _SENTENCE_END.search(text, match.end())
    return text[starts[-1]:after.start() if after else len(text)]


def _tense(sentence: str) -> int:
    """-1 for a plainly past sentence, 1 for a plainly future one, 0 when it is neither or both."""
    past, future = bool(_PAST.search(sentence)), bool(_FUTURE.search(sentence))
    return 0 if past == future else (1 if future else -1)


def _absolute(match: re.Match[str], day: date, sentence: str) -> str | None:
    groups = {name: value.lower() for name, value in match.groupdict().items() if value is not None}
    for name, resolve in _RESOLVERS:
        if name in groups:
            return resolve(groups, day, sentence)
    return None


def _day(groups: dict[str, str], day: date, sentence: str) -> str:
    return (day + timedelta(days=_DAY_SHIFT[groups["day"]])).isoformat()


def _ago(groups: dict[str, str], day: date, sentence: str) -> str | None:
    n = int(groups["n"]) if groups["n"].isdigit() else NUMBERS[groups["n"]]
    if n == 0:
        return None
    unit = groups["unit"]
    if unit in ("day", "week"):
        return (day - timedelta(days=n * (7 if unit == "week" else 1))).isoformat()
    if unit == "month":
        return _month_name(*_add_months(day.year, day.month, -n))
    return str(day.year - n) if day.year - n >= 1 else None


def _span(groups: dict[str, str], day: date, sentence: str) -> str:
    shift, span = _SHIFT[groups["rel"]], groups["span"]
    if span == "week":
        monday = day - timedelta(days=day.weekday()) + timedelta(weeks=shift)
        return f"week of {monday.isoformat()}"
    if span == "month":
        return _month_name(*_add_months(day.year, day.month, shift))
    return str(day.year + shift)


def _weekday(groups: dict[str, str], day: date, sentence: str) -> str:
    return _nearest_weekday(day, WEEKDAYS.index(groups["weekday"]), -1 if groups["wrel"] == "last" else 1)


def _on_weekday(groups: dict[str, str], day: date, sentence: str) -> str | None:
    direction = _tense(sentence)
    return _nearest_weekday(day, WEEKDAYS.index(groups["onday"]), direction) if direction else None


def _season(groups: dict[str, str], day: date, sentence: str) -> str:
    word, rel = groups["season"], groups["srel"]
    start = SEASON_START[word]
    # the season's year is the year its first month falls in; its span is [first day, first day three months on)
    spans = [(year, date(year, start, 1), date(*_add_months(year, start, 3), 1))
             for year in range(day.year - 2, day.year + 2)]
    if rel == "last":
        year = max(y for y, _, end in spans if end <= day)
    elif rel == "next":
        year = min(y for y, begin, _ in spans if begin > day)
    else:
        year = min(spans, key=lambda s: 0 if s[1] <= day < s[2] else min(abs((s[1] - day).days),
                                                                          abs((day - s[2]).days) + 1))[0]
    return f"{word} {year}/{(year + 1) % 100:02d}" if start == 12 else f"{word} {year}"


def _month(groups: dict[str, str], day: date, sentence: str) -> str | None:
    if _tense(sentence) != -1:
        return None
    month = MONTHS.index(groups["month"]) + 1
    return _month_name(day.year if month <= day.month else day.year - 1, month)


_RESOLVERS: tuple[tuple[str, Callable[[dict[str, str], date, str], str | None]], ...] = (
    ("day", _day), ("unit", _ago), ("span", _span), ("weekday", _weekday), ("onday", _on_weekday),
    ("season", _season), ("month", _month))


def _nearest_weekday(day: date, weekday: int, direction: int) -> str:
    """The first `weekday` strictly after `day` (direction 1) or the last one strictly before it (-1)."""
    step = (weekday - day.weekday()) % 7 if direction > 0 else (day.weekday() - weekday) % 7
    return (day + timedelta(days=direction * (step or 7))).isoformat()


def _add_months(year: int, month: int, months: int) -> tuple[int, int]:
    index = year * 12 + month - 1 + months
    return index // 12, index % 12 + 1


def _month_name(year: int, month: int) -> str:
    return f"{MONTHS[month - 1].capitalize()} {year}"
