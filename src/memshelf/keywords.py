"""A question becomes a handful of search terms (spec 000), and text becomes what the full-text indexes hold.

`keywords()` is spec 000's function, kept exactly: the terms a person is shown. Search matches more than it keeps
(`search_terms()`): words of two letters that carry meaning ("AI", "IP", "Go") and text in Chinese, Japanese and
Korean, which has no spaces between words. Such text is indexed and searched as overlapping pairs of characters
(bigrams): `index_text()` rewrites every CJK run of stored text as its bigrams (plus its last character alone, so
that every character starts an indexed token), and a CJK term of a question matches as the phrase of its bigrams,
which finds it anywhere inside a run ("事務所" in "東京の事務所は3階です"). Text without CJK is left as it is, so the
indexes of English text do not change.
"""

from __future__ import annotations

import re
import unicodedata

STOPWORDS = frozenset({
    "the", "and", "but", "for", "with", "you", "your", "was", "were", "are",
    "did", "does", "what", "when", "where", "who", "why", "how", "that",
    "this", "about", "have", "has", "had", "say", "said", "tell", "know",
    "can", "could", "would", "there", "then", "from", "into", "not", "get",
    "got", "please", "again", "any", "all", "its", "her", "his", "our",
})

SHORT_STOPWORDS = frozenset({
    "am", "an", "as", "at", "be", "by", "do", "he", "hi", "if", "in", "is", "it", "me", "my", "no", "of", "oh",
    "ok", "on", "or", "so", "to", "up", "us", "we", "ye", "yo",
    "ll", "re", "ve",  # what is left of "we'll", "you're", "I've"
})
"""Two-letter words that carry no topic: function words, and the tails of contractions. Written in capitals in a
question that is not all capitals ("IT", "US", "OR"), they are terms after all."""

# Letters and digits of any script: the spec's [a-z0-9]+ for ASCII text, without dropping "zürich" or "café".
_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """The words of `text`: runs of letters, digits and combining marks, as the full-text indexes cut them (SQLite's
    tokenizer keeps the categories L*, N*, Co and M*; PostgreSQL's parser keeps marks in words too). Marks matter
    wherever a word is written with them: Hindi "राहुल" is र ा ह ु ल, and text typed decomposed (NFD) spells "Zürich"
    as "Zu" + U+0308 + "rich"; without them such words fell apart into pieces no search term kept. Text is read
    composed (NFC) first."""
    if text.isascii():
        return _WORD.findall(text)
    out: list[str] = []
    run: list[str] = []
    for char in unicodedata.normalize("NFC", text):
        if char != "_" and (char.isalnum() or unicodedata.category(char) in _KEPT):
            run.append(char)
        elif run:
            out.append("".join(run))
            run = []
    if run:
        out.append("".join(run))
    return out


_KEPT = frozenset({"Mn", "Mc", "Me", "Co"})
"""The categories a word keeps besides letters and digits (str.isalnum): combining marks, and private use."""

_CJK = ("\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
        "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f")
"""Han ideographs, kana and hangul: the scripts written without spaces between words (Korean has spaces, but
attaches particles to words: "서울에서"). The indexes are made with this set (SQLite m010, PostgreSQL m011, which
has its own copy): changing it needs a migration that reindexes, on both backends."""
CJK_RUN = re.compile(f"[{_CJK}]+")
_SEGMENT = re.compile(f"[{_CJK}]+|[^{_CJK}]+")
_HIRAGANA = re.compile("[\u3040-\u309f]+")

DEFAULT_LIMIT = 4


def keywords(line: str, limit: int | None = DEFAULT_LIMIT) -> list[str]:
    """Return the first `limit` distinct informative words of `line`, lower-cased, in order.

    Words shorter than three characters and stopwords are dropped. `limit=None` keeps them all.
    """
    out: list[str] = []
    for word in words(line.lower()):
        if len(word) < 3 or word in STOPWORDS or word in out:
            continue
        out.append(word)
    return out if limit is None else out[:limit]


def search_terms(line: str, limit: int | None = None) -> list[str]:
    """The terms search matches for `line`, OR-ed: keywords()'s, in order, with two more kinds among them.

    - A run of CJK characters gives its overlapping bigrams ("東京の事務所" gives "東京", "京の", "の事", "事務",
      "務所"), a run of one character that character. A question has no spaces to say where its words are, so
      every pair is a term and bm25 ranks highest the memories that share the most, and the rarest, of them. Pairs
      of hiragana alone ("です", "ます") are Japanese grammar, not topic: they are dropped when the line has any
      other term.
    - A two-letter word is a term unless it is in SHORT_STOPWORDS; one of those is a term when written in capitals
      in a line that has lower-case letters too. So "AI", "IP", "UI" and "Go" are terms and "is", "to", "of", "me"
      are not, and "IT" is a term where "it" is not.
    """
    shouting, cjk = line.upper() == line, CJK_RUN.search(line) is not None
    out: list[str] = []
    for word in words(line):
        for segment in _SEGMENT.findall(word) if cjk else (word,):
            for term in _terms_of(segment, shouting):
                if term not in out:
                    out.append(term)
    if cjk and not all(_HIRAGANA.fullmatch(term) for term in out):
        out = [term for term in out if not _HIRAGANA.fullmatch(term)]
    return out if limit is None else out[:limit]


def _terms_of(segment: str, shouting: bool) -> list[str]:
    """The terms of a run of letters and digits that is all CJK or has none."""
    if CJK_RUN.match(segment):
        return _grams(segment)[:-1] or [segment]
    term = segment.lower()
    if len(term) == 2:
        keep = term not in SHORT_STOPWORDS or (segment.isupper() and not shouting)
    else:
        keep = len(term) >= 3 and term not in STOPWORDS
    return [term] if keep else []


def _grams(run: str) -> list[str]:
    """A CJK run's overlapping bigrams, then its last character alone."""
    return [run[i:i + 2] for i in range(len(run))]


def index_text(text: str) -> str:
    """`text` as the full-text indexes hold it: each CJK run replaced by its tokens (_grams), space-separated.
    Text without CJK comes back unchanged."""
    if text.isascii():  # most text, and no CJK: skip the pattern
        return text
    return CJK_RUN.sub(lambda run: " " + " ".join(_grams(run.group())) + " ", text)


def is_prefix(term: str) -> bool:
    """Whether a search term matches the indexed tokens it starts, or only the token equal to it. A word of three or
    more letters is a prefix (`printer` finds `printers`), except a short word ending in one "s" (SHORT_PLURAL); a
    two-letter word matches whole (`go` does not find `good`); a CJK pair matches the pair, and one CJK character
    every token it starts (every occurrence of it: index_text makes each character the start of a token)."""
    if len(term) <= 2:
        return len(term) == 1 and CJK_RUN.match(term) is not None
    # Full-width and other compatibility forms as the indexes read them ("ｂｕｓ" is "bus" on both backends).
    return SHORT_PLURAL.fullmatch(unicodedata.normalize("NFKC", term)) is None


SHORT_PLURAL = re.compile(r"[^\W\d_]{1,2}[^\W\d_s]s")
"""Words of three or four letters ending in one "s" (`aws`, `sms`, `gas`, `bus`, `cats`, `ones`) match their own
word whole, singular or plural, not as a prefix. The stemmers cut such a word's "s" before it is matched (SQLite's
porter always, PostgreSQL's English snowball often), and the stem left as a prefix began far more words than the
question meant: `aws` as `aw` found "away" and "award", `sms` as `sm` "small", `ones` as `on` every "on",
`bus` as `bu` "but" and "buy" (README, "Search text")."""
