"""The `rules` extractor: deterministic, offline, no model. Patterns over the user's own first-person statements.

The patterns are data (`RULES`): each names a regular expression with a group `v` (the value), what it becomes (a
fact under a stable key, or a memory under a topic), and how its value is cleaned. Only turns whose role is
"user" are read; in them, sentences that are questions, hypotheticals, pretend play or instructions to the model
are skipped, and a rule does not fire when a negation comes before its match ("I don't live in Paris"). What
matches is `mined`; an explicit "remember that ..." is `stated`. "I live in X" and "I moved to Y" write the same
key (`home_city`), so the newer value wins and the older one goes to the fact's history.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .base import Extractor, ExtractorProvider, Known, Proposal, Turn

I_AM = r"\bi(?:'m|’m| am)"
I_HAVE = r"\bi(?:'ve|’ve| have)"
_CAPITAL = "A-Z" + "".join(c for c in map(chr, range(0xC0, 0x590)) if c.isupper()) \
    + "".join(c for c in map(chr, range(0x1E00, 0x2000)) if c.isupper())
"""Capital letters of the Latin, Greek, Cyrillic and Armenian alphabets: a name may begin with "É", "Å" or "Ł"."""
PROPER = r"(?P<v>[^\W\d_][\w'’.-]*(?: [^\W\d_][\w'’.-]*){0,4})"  # words beginning with a letter of any alphabet
NAME = (r"(?P<v>(?-i:[" + _CAPITAL + r"])[\w'’-]*(?: (?-i:[" + _CAPITAL + r"])[\w'’-]*){0,3})")  # capitalised only
INITIAL_DOT = r"(?<=\b(?-i:[A-Z]))\.(?= )"  # the period of an initial ("Ursula K. Le Guin") does not end a value
TEXT = r"(?P<v>(?:[^,.;!?]|" + INITIAL_DOT + r"){2,80})"
EMAIL = r"(?P<v>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)"
PHONE = r"(?P<v>\+?\d[\d ().-]{5,18}\d)"
URL = r"(?P<v>(?:https?://|www\.)[^\s,;!?]+[^\s,;!?.]|[\w-]+(?:\.[\w-]+)*\.(?:com|org|net|io|dev|me)(?:/[^\s,;!?]*)?)"
RELATIVE = (r"wife|husband|partner|boyfriend|girlfriend|fianc[eé]e?|son|daughter|mom|mum|mother|dad|father|"
            r"brother|sister|grandmother|grandma|grandfather|grandpa|baby|kid|child|twin")
PET = r"dog|puppy|cat|kitten|parrot|rabbit|bunny|hamster|horse|turtle|tortoise|snake|lizard|goldfish|fish|bird"
DOG_BREED = (r"labrador|lab|golden retriever|retriever|poodle|beagle|terrier|spaniel|collie|border collie|husky|"
             r"corgi|dachshund|pug|bulldog|greyhound|whippet|chihuahua|german shepherd|shepherd|rottweiler|doberman|"
             r"schnauzer|shih tzu|pomeranian|sheepdog|dalmatian|great dane|mastiff|vizsla|weimaraner|labradoodle|"
             r"cockapoo|mutt")
CAT_BREED = r"tabby|siamese|maine coon|ragdoll|sphynx|bengal cat|british shorthair|persian cat"
LANGUAGE = (r"english|spanish|portuguese|french|german|italian|dutch|polish|russian|ukrainian|mandarin|chinese|"
            r"cantonese|japanese|korean|hindi|urdu|bengali|arabic|hebrew|turkish|greek|swedish|norwegian|danish|"
            r"finnish|czech|hungarian|romanian|vietnamese|thai|indonesian|malay|tagalog|swahili|persian|farsi|"
            r"catalan|basque|irish|welsh|sign language")


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern and what its match becomes. `key` and `content` are templates over the match's named groups
    ({v} is the cleaned value); a rule has a key (a fact) or a topic (a memory). The cues are a cheap test run
    first: most sentences hold none of a rule's words, and a substring test costs far less than a search."""

    name: str
    cues: tuple[str, ...]  # lower-case strings of which the sentence must hold one for the pattern to be tried
    pattern: str
    value: str = "text"  # how `v` is cleaned: a name in CLEANERS
    key: str | None = None
    topic: str | None = None
    content: str | None = None
    source: str = "mined"
    negation_ok: bool = False  # the pattern itself says "not" ("I don't eat pork"), so a negation does not stop it
    question_ok: bool = False  # a polite request ("could you remember that ...?") is not a question about the user


RULES: tuple[Rule, ...] = (
    # explicit requests: the user's own words, kept as said. Advice to someone else is not one: "Remember, ..."
    # without a please, "remember to ...", "Remember Jon, ..." (a name and a comma), and a question without "can
    # you" ("Remember that book I told you about?") are left alone
    Rule("remember", ("remember", "note", "keep in mind", "forget"),
         r"^(?P<asked>(?:can|could|would|will) you (?:please )?|please )?(?:remember|note|keep in mind|"
         r"don't forget|do not forget|make a note)(?: that| this)?(?(asked)[:,]?|:?) "
         r"(?!when\b|what\b|how\b|where\b|who\b|the time\b|to\b)(?!(?-i:[A-Z])[\w'’-]*,)"
         r"(?(asked)|(?![^?]*\?\s*$))(?P<v>.{3,300})$",
         value="request", topic="noted", content="{v}", source="stated", negation_ok=True, question_ok=True),
    # names and what to call the user
    Rule("name", ("name",),
         r"\bmy (?:full |first |real )?name(?: is|'s|’s) " + PROPER, value="proper", key="user_name"),
    Rule("name_called", ("called", "named"),
         I_AM + r" (?:called|named) " + PROPER, value="proper", key="user_name"),
    # an introduction: the sentence is "I'm Kaleb" (after "Hi, " or "Hello! ", which sentences() drops), a name
    # capitalised as names are, and not a nationality, faith or language ("I'm Italian.")
    Rule("introduction", ("i'm", "i am", "i’m"),
         r"^(?:(?:hello|hi|hey|hiya|howdy|greetings|good (?:morning|afternoon|evening))(?: there| all| everyone)?"
         r"[,!]?\s+|(?:there|all|everyone),?\s+)?" + I_AM + r" " + NAME
         + r"(?=(?:,? here)?\s*(?:$|[,.!;])|\s+(?:and|from)\b)", value="name", key="user_name"),
    Rule("call_me", ("call me", "go by", "called", "nickname", "calls me"),
         r"\b(?:call me|i go by|i prefer to be called|my nickname is|everyone calls me) " + PROPER,
         value="proper", key="preferred_name"),
    # where the user lives (one key: a move replaces the old value)
    Rule("home", ("live", "reside", "stay", "settled"),
         r"\bi (?:live|reside|stay|settled)(?: now)? in " + PROPER, value="place", key="home_city"),
    Rule("home_have_been", ("living", "based", "staying"),
         I_HAVE + r" been (?:living|based|staying) in " + PROPER, value="place", key="home_city"),
    Rule("home_have_lived", ("lived",),  # "for"/"since" say it still holds: "I've lived in Rome" alone may be past
         I_HAVE + r" lived in (?P<v>[a-z][\w'’.-]*(?: [a-z][\w'’.-]*){0,4}?) (?:for|since)\b", value="place",
         key="home_city"),
    Rule("home_living", ("living", "based", "located", "settled"),
         I_AM + r" (?:now )?(?:living|based|located|settled) in " + PROPER, value="place",
         key="home_city"),
    Rule("home_moved", ("moved", "relocated"),
         r"\b(?:i|we) (?:just |recently |finally )?(?:moved|relocated)(?: back)? to " + PROPER,
         value="place", key="home_city"),
    Rule("home_moved_have", ("moved", "relocated"),
         I_HAVE + r" (?:just |recently )?(?:moved|relocated)(?: back)? to " + PROPER,
         value="place", key="home_city"),
    Rule("home_is", ("home", "house", "flat", "apartment"),
         r"\bmy (?:home|hometown now|house|flat|apartment) is in " + PROPER, value="place",
         key="home_city"),
    Rule("hometown", ("from", "grew up", "raised", "hometown"),
         r"\b(?:i(?:'m|’m| am) (?:originally )?from|i grew up in|i was raised in|my hometown is) "
         + PROPER, value="place", key="hometown"),
    Rule("address", ("address",),
         r"\bmy (?:home |postal |street )?address is (?P<v>[^;!?]{6,120})", value="text",
         key="home_address"),
    # work
    Rule("employer", ("work",),
         r"\bi(?: work|'m working|’m working| am working) (?:at|for) " + PROPER, value="employer",
         key="employer"),
    Rule("employer_is", ("employ", "working", "joined"),
         r"\b(?:my employer is|i(?:'m|’m| am|'ve been|’ve been| have been) (?:employed|working) "
         r"(?:at|by|for)|i joined) " + PROPER,
         value="proper", key="employer"),  # capitalised only: "I joined in", "I joined the class" are no employers
    # "I'm a/an ..." is a job when one of its next four words ends like one ("I am a part of ... for" is not)
    Rule("occupation", ("work as", "job", "profession", "role", " a ", " an "),
         r"\b(?:i work as|my job is|my profession is|my job title is|my role is|i(?:'m|’m| am) "
         r"(?:a|an) (?=(?:[\w-]+ ){0,3}(?!(?:for|or|nor|door|floor)\b)[\w-]*(?:er|ist|or|ian|ant|ent|nurse|chef|"
         r"doctor|lawyer|teacher|student|engineer|manager|designer|developer|writer|pilot|cook|barista|scientist|architect|librarian)\b))"
         r"(?: an? | the )?" + TEXT, value="role", key="occupation"),
    # family and pets
    Rule("relative_name", ("my ",),
         r"\bmy (?P<rel>" + RELATIVE + r")(?:'s|’s)? (?:name is|is called|is named) " + PROPER,
         value="proper", key="{rel}_name"),
    Rule("relative_named", ("my ",),
         r"\bmy (?P<rel>" + RELATIVE + r"),? " + r"(?P<v>[a-z][\w'’-]*),? (?:is|was|turned|"
         r"just|works|lives|loves|likes)\b", value="proper", key="{rel}_name"),
    Rule("family_have", ("have", "i've", "i’ve"),
         I_HAVE + r" (?P<v>(?:a|an|one|two|three|four|five|six|\d) (?:\w+ )?(?:" + RELATIVE +
         r"|children|kids|sons|daughters|brothers|sisters|siblings|grandchildren)s?\b[^,.;!?]{0,40})",
         value="text", topic="family", content="The user has {v}."),
    Rule("married", ("married", "divorced", "engaged", "single", "widowed"),
         I_AM + r" (?P<v>married|divorced|engaged|single|widowed)\b", value="text",
         key="relationship_status"),
    Rule("pet_have", ("have", "i've", "i’ve"),
         I_HAVE + r" (?:got )?(?P<v>(?:a|an|one|two|three|four|\d) (?:\w+ )?(?:" + PET + "|" + DOG_BREED + "|"
         + CAT_BREED + r")s?\b[^,.;!?]{0,40})", value="text", topic="pets", content="The user has {v}."),
    Rule("pet_name", ("my ",),
         r"\bmy (?P<pet>" + PET + r")(?:'s|’s)? (?:name is|is called|is named) " + PROPER,
         value="proper", key="{pet}_name"),
    Rule("pet_named", ("my ",),
         r"\bmy (?:\w+ )?(?P<pet>" + PET + r"),? (?P<v>[a-z][\w'’-]*),? (?:is|was|loves|likes|"
         r"turned|just|hates)\b", value="proper", key="{pet}_name"),
    Rule("dog_breed_named", ("my ",),
         r"\bmy (?:\w+ )?(?:" + DOG_BREED + r"),? (?P<v>[a-z][\w'’-]*),? (?:is|was|loves|likes|turned|just|hates|"
         r"(?:is|was) (?:called|named))\b", value="proper", key="dog_name"),
    Rule("cat_breed_named", ("my ",),
         r"\bmy (?:\w+ )?(?:" + CAT_BREED + r"),? (?P<v>[a-z][\w'’-]*),? (?:is|was|loves|likes|turned|just|hates)\b",
         value="proper", key="cat_name"),
    # likes and dislikes
    Rule("favorite", ("favorite", "favourite"),
         r"\bmy (?:all-time |absolute )?favou?rite (?P<what>[a-z]+(?: [a-z]+)?) is " + TEXT,
         value="text", key="favorite_{what}"),
    Rule("dislike", ("hate", "dislike", "detest", "loathe", "stand", "like", "enjoy"),
         r"\bi (?:really |absolutely |honestly )?(?:hate|dislike|detest|loathe|can't stand|cannot stand|"
         r"can’t stand|don't like|do not like|don’t like|don't enjoy|do not enjoy)(?P<v> [^,.;!?]{2,60})",
         value="thing", topic="preferences", content="The user dislikes {v}.", negation_ok=True),
    Rule("like", ("love", "adore", "enjoy", "like", "into", "fan of"),
         r"\bi(?: really| absolutely| totally| just)?(?: love| adore| enjoy| like|(?:'m|’m| am) into|"
         r"(?:'m|’m| am) an? (?:big |huge )?fan of)(?P<v> [^,.;!?]{2,60})",
         value="thing", topic="preferences", content="The user likes {v}."),
    # allergies and diet
    Rule("allergy", ("allergic",),
         I_AM + r" (?:severely |very |mildly |deathly )?allergic to " + TEXT, value="thing",
         topic="health", content="The user is allergic to {v}."),
    Rule("allergy_have", ("allerg",),
         I_HAVE + r" (?:a |an )?(?:severe |mild )?(?P<v>[a-z]+(?: [a-z]+)?) allerg(?:y|ies)\b",
         value="thing", topic="health", content="The user is allergic to {v}."),
    Rule("intolerance", ("intolerant",),
         I_AM + r" (?P<v>lactose|gluten|fructose|histamine) intolerant\b", value="thing",
         topic="health", content="The user is {v} intolerant."),
    Rule("diet", ("vegan", "vegetarian", "pescatarian", "pescetarian", "keto", "paleo", "celiac", "coeliac", "diabetic",
          "halal", "kosher"),
         I_AM + r" (?:a |an |strictly |fully |mostly )?(?P<v>vegan|vegetarian|pescatarian|pescetarian|"
         r"keto|paleo|celiac|coeliac|diabetic|halal|kosher)\b", value="thing", key="diet"),
    Rule("diet_follow", ("follow", "eat", "keep", " on "),
         r"\bi(?: follow| eat| keep| am on|'m on|’m on) (?:a |an )?(?P<v>vegan|vegetarian|pescatarian|"
         r"keto|paleo|gluten-free|low-carb|halal|kosher|plant-based)(?: diet)?\b", value="thing", key="diet"),
    Rule("diet_avoid", ("eat", "drink"),
         r"\bi (?:don't|do not|don’t|never|can't|cannot|can’t) (?:eat|drink) (?P<v>[^,.;!?]{2,40})",
         value="thing", topic="diet", content="The user does not eat or drink {v}.", negation_ok=True),
    # birthdays and ages
    Rule("birthday", ("birthday",),
         r"\bmy birthday is (?:on )?" + TEXT, value="date", key="birthday"),
    Rule("born_on", ("born",),
         r"\bi was born on " + TEXT, value="date", key="birthday"),
    Rule("born_in_year", ("born",),
         r"\bi was born in (?P<v>(?:19|20)\d\d)\b", value="text", key="birth_year"),
    Rule("age", ("i'm", "i am", "i’m"),
         I_AM + r" (?P<v>\d{1,3})(?: years? old| yrs old| years of age)?(?=\s*(?:$|[,;!]|\.(?!\d)| and\b| now\b|"
         r" this year\b| today\b))", value="age", key="age"),
    Rule("age_turned", ("turned",),
         r"\bi (?:just )?turned (?P<v>\d{1,3})\b", value="age", key="age"),
    # languages
    Rule("native_language", ("language", "tongue"),
         r"\bmy (?:native|first|mother) (?:language|tongue) is (?P<v>" + LANGUAGE + r")\b",
         value="proper_any", key="native_language"),
    Rule("speaks", ("speak", "fluent"),
         r"\bi(?: speak|(?:'m|’m| am) fluent in) (?P<v>(?:" + LANGUAGE + r")(?:(?:, | and "
         r"|, and )(?:" + LANGUAGE + r"))*)\b", value="proper_any", topic="languages", content="The user speaks {v}."),
    Rule("learning_language", ("learning", "studying"),
         I_AM + r" (?:currently )?(?:learning|studying) (?P<v>" + LANGUAGE + r")\b",
         value="proper_any", topic="languages", content="The user is learning {v}."),
    # contact details
    Rule("email", ("@",),
         r"\b(?:my (?:work |personal )?e-?mail(?: address)? is|(?:e-?mail|reach|contact) me at) " + EMAIL,
         value="text", key="email"),
    Rule("phone", ("phone", "cell", "mobile", " me at", " me on"),
         r"\b(?:my (?:phone|cell|mobile|telephone)(?: number)? is|(?:call|text|ring) me (?:at|on)) "
         + PHONE, value="text", key="phone"),
    Rule("website", ("website", "site", "blog", "homepage", "portfolio", "github"),
         r"\bmy (?:personal )?(?:website|site|blog|homepage|portfolio|github)(?: page)? is (?:at )?"
         + URL, value="text", key="website"),
)

# A sentence ends at . ! or ? before a space, except after a title ("Dr. Lindqvist"), or at a line break.
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_TITLE_END = re.compile(r"\b(?:Dr|Mr|Ms|Mrs|Mx|St|Prof|Sr|Jr|[A-HJ-Z])\.$")  # a title or an initial ("J. R. Smith")
_LEAD = re.compile(r"^(?:(?:oh|ok|okay|so|well|also|btw|by the way|and|but|anyway|hey|hi|fyi|actually|yeah|yes),?\s+)+",
                   re.IGNORECASE)
_QUESTION = re.compile(r"\?\s*$|^(?:do|does|did|can|could|would|will|shall|should|is|are|am|was|were|have|has|"
                       r"what|where|who|whom|whose|when|why|how|which|may|might)\b", re.IGNORECASE)
_UNREAL = re.compile(
    r"\b(?:if|suppose|supposing|imagine|imagining|pretend|pretending|let's say|lets say|let us say|what if|"
    r"hypothetically|in theory|would|i'd|i’d|wish|someday|one day|maybe|perhaps|might|roleplay|role-play|role play|"
    r"act as|in character|my character|in this game|in the story|in my novel|in the book|as if|dream|dreams|dreamed|"
    r"dreamt|planning to|plan to|hope to|want to|wanna|going to|gonna|thinking of|thinking about|considering)\b",
    re.IGNORECASE)
_ASIDE = re.compile(
    r",? if (?:that|this|it) (?:helps|matters|is relevant|'s relevant|’s relevant|makes a difference|changes anything)"
    r"|,? if you (?:need|want|must|care|were wondering|are curious|'re curious|’re curious)(?: to know| it| that)?"
    r"|,? if (?:it's|it’s|it is|that's|that’s) (?:urgent|easier|useful|important)|,? if anything\b",
    re.IGNORECASE)
"""An "if" that asks nothing of the world ("I live in Lisbon, if that helps"): cut before looking for a hypothetical."""
_INJECTION = re.compile(r"\b(?:ignore|disregard|forget) (?:all |any |the |your )?(?:previous|prior|above|earlier) "
                        r"(?:instructions|messages|rules)|\bsystem prompt\b|\byou are now\b|\bnew instructions\b",
                        re.IGNORECASE)
_FRAME = re.compile(
    r"\b(?:let's|lets|let us) (?:play|imagine)\b|\brole[- ]?play\b|\bpretend\b|\bhypothetical(?:ly)?\b"
    r"|\bin (?:my|a|the|this|our) (?:story|novel|book|game|dreams?|script|play|fiction)\b"
    r"|\b(?:a|my) (?:story|poem|scene|script) (?:where|in which|about)\b",
    re.IGNORECASE)
"""A turn that sets up play or a hypothetical ("Let's roleplay. I'm Captain Jack."): none of its sentences is about
the user, though the frame and the claim are in different sentences."""
_INSTRUCTION = re.compile(
    r"(?:^|[.!?]\s+)(?:please\s+|now\s+)?(?:forget|translate|repeat|rewrite|rephrase|paraphrase|proofread|"
    r"summari[sz]e|spell)\b|\bsay\s*:|\brepeat after me\b|\bwrite (?:a|me a|an) (?:story|poem|scene|script|"
    r"dialogue|letter)\b", re.IGNORECASE)
"""A turn that asks the model to do something with words ("Forget that I live in Porto.", "Translate to French: I
live in Paris.", "Say: my name is Bob."): the words are the task's, not a statement about the user."""
_NEGATION = re.compile(r"\b(?:not|never|no longer|no|nobody|nothing|neither|nor)\b|n't\b|n’t\b", re.IGNORECASE)
_CONNECTOR = {"de", "da", "do", "del", "la", "le", "of", "upon", "on", "am", "an", "der", "van", "von", "y", "el"}
_TRAILING = re.compile(
    r"\s+(?:(?:last|this|next|a|one|two|three|few|several|couple of) (?:years?|months?|weeks?|days?|spring|summer|"
    r"autumn|fall|winter)(?: ago)?|now|right now|recently|lately|these days|nowadays|anymore|a lot|so much|very much|"
    r"too|as well|since\b.*|for\b.*|because\b.*|when\b.*|with\b.*|and i\b.*|but\b.*)$", re.IGNORECASE)
_NOT_A_THING = {"you", "it", "that", "this", "them", "him", "her", "those", "these", "how", "what", "when", "where",
                "why", "to", "being", "myself", "yourself", "your", "the idea", "so", "which", "who"}


def _words_capitalised(value: str) -> str:
    """The leading run of capitalised words (lower-case connectors allowed between two of them)."""
    words, kept = value.split(), list[str]()
    for index, word in enumerate(words):
        if word[:1].isupper() or word[:1].isdigit() and kept:
            kept.append(word)
        elif word in _CONNECTOR and kept and index + 1 < len(words) and words[index + 1][:1].isupper():
            kept.append(word)
        else:
            break
    return " ".join(kept).rstrip(".'’-")


_NOT_A_NAME = frozenset(
    ("american canadian mexican brazilian argentinian chilean colombian peruvian cuban british scottish welsh irish "
     "australian indian pakistani nigerian kenyan ghanaian egyptian moroccan israeli iranian iraqi syrian lebanese "
     "filipino asian african european latino latina hispanic black white native catholic christian protestant "
     "muslim jewish buddhist hindu sikh atheist agnostic mormon orthodox ok okay sorry fine good back here done "
     "ready sure new so very really just not also still always never too quite the a an").split()) \
    | frozenset(LANGUAGE.split("|"))


def _name(value: str) -> str:
    """A person's name: capitalised words, none of which is a nationality, faith, language, or a word of an
    ordinary sentence written in title case ("I'm So Tired")."""
    name = _words_capitalised(value)
    return "" if any(word.casefold() in _NOT_A_NAME for word in name.split()) else name


def _place(value: str) -> str:
    name = _words_capitalised(value)
    return "" if name in {"I", "The", "A", "My"} else name


_NOT_AN_EMPLOYER = {"home", "night", "nights", "weekends", "myself", "free", "fun", "hours", "a", "an", "least",
                    "times", "it", "this", "that", "them", "him", "her", "you", "me", "us", "money", "peanuts", "food",
                    "tips", "now", "some", "one", "my", "your", "his", "their", "our", "any", "all", "what", "which",
                    "whoever", "anyone", "someone", "people", "clients", "night-time", "daytime", "lunch"}
_NOT_AN_EMPLOYER_THE = re.compile(r"the (?:moment|minute|same|weekends?|end|time|start|beginning|last|latest|most|"
                                  r"least|best|very|top|bottom|rest|whole|first)\b", re.IGNORECASE)
_EMPLOYER_END = re.compile(r" (?:in|on|at|as|since|for|with|and|but|because|where|near|from|so|until|till|during|"
                           r"then|now|today|every|each|part-time|full-time|remotely|downtown)\b.*$", re.IGNORECASE)


def _employer(value: str) -> str:
    """A capitalised name ("Siemens"); else the words as said ("acme corp", "the university"), unless they say
    how or when rather than where ("at home", "for myself", "at night")."""
    name = _words_capitalised(value)
    if name:
        return name
    said = _EMPLOYER_END.sub("", _TRAILING.sub("", value.strip())).strip().rstrip(".")
    words = said.split()
    if not words or _NOT_AN_EMPLOYER_THE.match(said) or words[0].lower() in _NOT_AN_EMPLOYER:
        return ""
    return said


def _thing(value: str) -> str:
    value = _TRAILING.sub("", value.strip()).strip()
    first = value.split(" ", 1)[0].lower()
    if not value or value.lower() in _NOT_A_THING or first in _NOT_A_THING:
        return ""
    return value


def _role(value: str) -> str:
    value = _thing(value)
    return re.sub(r"^(?:an?|the) ", "", value, flags=re.IGNORECASE)


def _age(value: str) -> str:
    return value if value.isdigit() and 1 <= int(value) <= 120 else ""


def _request(value: str) -> str:
    value = value.strip().rstrip("?.! ")
    return value[:1].upper() + value[1:] if len(value) >= 3 else ""


CLEANERS: dict[str, Callable[[str], str]] = {
    "proper": _words_capitalised,
    "name": _name,
    "place": _place,
    "employer": _employer,
    "proper_any": lambda value: value.title(),
    "text": lambda value: _TRAILING.sub("", value.strip()).strip().rstrip("."),
    "thing": _thing,
    "role": _role,
    "age": _age,
    "date": lambda value: _TRAILING.sub("", value.strip()).strip(),
    "request": _request,
}


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: Rule
    regex: re.Pattern[str]
    clean: Callable[[str], str]


def _compile(rules: Sequence[Rule]) -> tuple[_Compiled, ...]:
    return tuple(_Compiled(rule, re.compile(rule.pattern, re.IGNORECASE), CLEANERS[rule.value]) for rule in rules)


def _by_cue(rules: Sequence[Rule]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Each cue with the positions of the rules it lets through, so a sentence is tested once per cue."""
    table: dict[str, list[int]] = {}
    for index, rule in enumerate(rules):
        for cue in rule.cues:
            table.setdefault(cue, []).append(index)
    return tuple((cue, tuple(indexes)) for cue, indexes in table.items())


def sentences(text: str) -> list[str]:
    """The text cut into sentences, each without its leading filler ("Oh, so ..."); a title ("Dr. Lindqvist")
    does not end one."""
    parts: list[str] = []
    for part in _SENTENCE.split(text):
        if parts and _TITLE_END.search(parts[-1]):
            parts[-1] += " " + part
        elif part.strip():
            parts.append(part.strip())
    return [_LEAD.sub("", part) for part in parts]


class RulesExtractor(Extractor):
    """Deterministic, offline extraction with a table of patterns (`RULES` by default; pass your own to extend)."""

    name = "rules"

    def __init__(self, rules: Sequence[Rule] = RULES) -> None:
        self._rules = _compile(rules)
        self._cues = _by_cue(rules)

    def propose(self, turns: Sequence[Turn], known: Known | None = None) -> list[Proposal]:
        """What the user's turns say, in order. A value proposed for a fact is what a later turn is compared with:
        "I live in Lisbon." then "I live in Porto." when the fact was Porto proposes both, and Porto is current."""
        known = known or Known()
        facts, sources = dict(known.facts), dict(known.fact_sources)
        known = replace(known, facts=facts, fact_sources=sources)
        found: list[Proposal] = []
        for turn in turns:
            if turn.role == "user":
                said = self._from_turn(turn, known)
                found.extend(said)
                for proposal in said:
                    if proposal.op == "set_fact" and proposal.key is not None and proposal.value is not None:
                        facts[proposal.key], sources[proposal.key] = proposal.value, proposal.source
        return found

    def _from_turn(self, turn: Turn, known: Known) -> list[Proposal]:
        evidence = () if turn.id is None else (turn.id,)
        found: list[Proposal] = []
        if _INJECTION.search(turn.content) or _INSTRUCTION.search(turn.content) or _FRAME.search(turn.content):
            return []  # a turn that instructs the model, or sets up play, says nothing about the user, in any sentence
        for sentence in sentences(turn.content):
            if _UNREAL.search(_ASIDE.sub("", sentence)):
                continue
            question = bool(_QUESTION.search(sentence))
            found.extend(self._from_sentence(sentence, question, evidence, known))
        return found

    def _from_sentence(self, sentence: str, question: bool, evidence: tuple[str, ...],
                       known: Known) -> list[Proposal]:
        found: list[Proposal] = []
        lowered = sentence.lower()
        cued = {index for cue, indexes in self._cues if cue in lowered for index in indexes}
        for index in sorted(cued):
            compiled = self._rules[index]
            rule = compiled.rule
            if question and not rule.question_ok:
                continue
            match = compiled.regex.search(sentence)
            if match is None or (not rule.negation_ok and _NEGATION.search(sentence, 0, match.end())):
                continue
            value = compiled.clean(match.group("v"))
            if value:
                found.append(_proposal(rule, match, value, evidence, known))
                if rule.source == "stated":
                    break  # "remember that I live in Porto" is kept as said, not mined twice
        return found


def _proposal(rule: Rule, match: re.Match[str], value: str, evidence: tuple[str, ...], known: Known) -> Proposal:
    groups = {name: (text or "").strip().lower() for name, text in match.groupdict().items()}
    reason = f"rule {rule.name!r} matched {match.group(0).strip()!r}"
    if rule.key is not None:
        key = rule.key.format(**groups).replace(" ", "_")
        current = known.facts.get(key)
        same_source = known.fact_sources.get(key, rule.source) == rule.source  # else the Shelf weighs the sources
        if current is not None and current.casefold() == value.casefold() and same_source:
            return Proposal("skip", rule.source, evidence, key=key, value=value, reason=f"{key} is already {current!r}")
        if current is not None and current.casefold() == value.casefold():
            reason += f"; {key} is already {current!r}, from another source"
        elif current is not None:
            reason += f"; replaces the current value {current!r}, which goes to the fact's history"
        return Proposal("set_fact", rule.source, evidence, key=key, value=value, reason=reason)
    content = (rule.content or "{v}").format(**{**groups, "v": value})
    sources = known.memory_sources or (rule.source,) * len(known.memories)
    if any(memory.casefold() == content.casefold() and source == rule.source
           for memory, source in zip(known.memories, sources)):  # from another source, the Shelf keeps the stronger
        return Proposal("skip", rule.source, evidence, topic=rule.topic, content=content, reason="already remembered")
    return Proposal("remember", rule.source, evidence, topic=rule.topic, content=content, reason=reason)


def _factory(model: str | None) -> Extractor:
    return RulesExtractor()


provider = ExtractorProvider(_factory)
"""What the `rules` entry point of the `memshelf.extractors` group names."""
