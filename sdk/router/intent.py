"""Did the caller ask for this action? The deterministic ("keywords") check of the side-effect policy.

The question is cut into clauses (at punctuation, "but", and self-corrections like "no wait", "actually",
"I mean"), and each clause is read in order: a clause that asks for the action (one of its verbs, or a
request frame like "can you" / "I'd like" with the tool's nouns or the call's own values), a clause that
refuses it (the same under a negation or a doubt: "don't", "not yet", "if I", "how do I"; or a retraction:
"never mind", "forget it"), or neither. The last clause that decides, decides. The verbs come from the
tool's name and description through a synonym table, compared by Snowball stems; `phrases` add more.

Example:
    >>> from duetaspan.registry import ToolSpec
    >>> spec = ToolSpec("book_flight", "Book a flight.", {"type": "object"}, side_effect=True)
    >>> asked_for(spec, "don't book it yet, hmm, no wait, actually yeah book it")[0]
    True
    >>> asked_for(spec, "how far ahead do I need to book")[0]
    False
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from duetaspan.registry import ToolSpec
from duetaspan.router.grounding import Grounding, grounded
from duetaspan.router.lexicon import identifier_words, stem, stems, words

# Action words (from a tool's name or description) -> what callers say to ask for that action.
ACTION_PHRASES: dict[str, tuple[str, ...]] = {
    "book": ("book", "reserve", "reservation", "get me on", "lock that in", "lock it in", "hold", "save us",
             "get a table", "squeeze us in", "come in", "i'll take", "take it", "let's do", "go with",
             "put me down", "get me in", "sign me up", "grab", "have room", "have space", "fit us", "fit in", "confirm",
             "pencil me in", "pencil us in", "fit me in", "squeeze me in"),
    "cancel": ("cancel", "call off", "kill", "stop", "don't need it anymore", "don't want the order"),
    "transfer": ("transfer", "connect me", "connect", "put me through", "speak to", "speak with", "talk to",
                 "human", "real person", "person", "operator", "representative", "agent", "rep", "get me"),
    "end": ("hang up", "end the call", "end this call", "goodbye", "bye", "that's all", "that is all",
            "that's everything", "that's it", "we're done", "i'll let you go", "all set", "have a good one",
            "take care", "all good", "i'm good", "nothing else", "that'll be all", "that will be all",
            "i'm done", "gonna go", "gotta go", "got to go", "have to go", "need to go", "i'll go now",
            "i'm going to go", "let you go"),
    "hang": ("hang up", "end the call", "goodbye", "bye"),
    "pay": ("pay", "payment", "send", "transfer", "owe"),
    "send": ("send", "pay", "transfer", "wire"),
    "order": ("order", "buy", "purchase"),
    "buy": ("buy", "purchase", "order", "get"),
    "schedule": ("schedule", "book", "set up", "set something up", "put me down", "get me in", "come in",
                 "i'll take", "appointment", "do the", "pencil me in", "fit me in", "squeeze me in"),
    "delete": ("delete", "remove"),
    "remove": ("remove", "delete", "take off"),
    "add": ("add", "put", "throw", "i'll take", "i want", "let me get", "go with", "get me", "i'll go with",
            "grab", "buy", "purchase", "order", "take"),
    "update": ("update", "change", "set", "switch", "make it", "make that", "fix", "correct", "replace",
               "swap", "put", "record", "save", "put on file", "register", "should be", "add", "want"),
    "filter": ("filter", "narrow", "only", "lower", "raise", "has to", "have to", "need", "must", "take",
               "nothing over", "at least", "at most", "minimum", "maximum", "above", "below", "under", "over",
               "no more than", "out of my range", "too expensive", "needs to", "want", "make sure"),
    "modify": ("modify", "change", "update", "set", "switch", "turn on", "turn off", "enable", "disable",
               "enroll", "make", "have it", "put", "activate", "start", "sign up"),
    "turn": ("turn on", "turn off", "set up", "enable", "start", "activate"),
    "set": ("set", "change", "update"),
    "switch": ("switch", "move", "change", "upgrade", "downgrade", "bump", "put me on", "go with",
               "sign me up"),
    "change": ("change", "switch", "update", "set", "move", "upgrade", "downgrade"),
    "create": ("create", "open", "make", "set up"),
    "refund": ("refund", "money back"),
    "reserve": ("reserve", "book", "reservation", "hold", "save us"),
    "submit": ("submit", "send", "file"),
}  # fmt: skip
# Tools whose action is leaving: words that show the caller is not leaving yet.
STAY = (
    "one more",
    "another question",
    "before you go",
    "don't hang up",
    "hold on",
    "wait",
    "hello",
    "hear me",
)
NEGATIONS = frozenset(
    "don't dont not never no won't wouldn't shouldn't can't cannot isn't without before until unless "
    "whether might maybe thinking considering".split()
)
DOUBTS = ("how do", "how would", "how can", "how long", "how much", "how far", "what happens", "what if",
          "should i", "do i need", "do i have to", "is there", "not sure", "i'll call back", "get back to you",
          "hold off", "later", "if i", "if we", "rather not", "was going to", "were going to", "can i still",
          "too late")  # fmt: skip
WH_WORDS = frozenset("what when where which who how why".split())
AUXILIARIES = frozenset("is are does do did was were has have".split())
SUBJECTS = frozenset("i you we they he she there that this those these any my the your".split())
POLITE = ("is it possible", "is there a person", "is there someone", "do you think you could", "why don't you",
          "do you have room", "do you have space", "do you have a table", "do you have availability",
          "do you have anything")  # fmt: skip
# Generic verbs that ask for a tool's action when the tool's noun or the call's own value follows them.
GENERIC_VERBS = ("activate", "start", "enable", "set up", "do", "get", "make", "put", "go", "change",
                 "switch", "turn on", "sign me up", "process", "submit", "arrange", "confirm", "handle")  # fmt: skip
FRAMES = ("i want", "i'd like", "i would like", "i need", "we need", "we'd like", "can you", "could you",
          "would you", "will you", "please", "let's", "go ahead", "i'll take", "i'll have", "give me",
          "get me", "put me", "sign me", "set me", "make it", "make that", "has to", "have to", "needs to",
          "should be", "must", "only", "just", "instead", "i'll go with", "go with", "let me get", "wanna",
          "can i", "could i", "i'd want", "i really need", "we'd love")  # fmt: skip
# A request frame followed by one of these asks for something else ("can you check flights for Ada").
INFO_WORDS = frozenset(
    "know tell explain wonder wondering curious status info information difference check find search look "
    "show see compare list".split()
)
CONFIRMATIONS = ("yes", "yeah", "yep", "sure", "ok", "okay", "go ahead", "do it", "please do", "sounds good",
                 "perfect", "that works", "lock that in", "let's do it", "alright", "great")  # fmt: skip
# "and two packs of socks too": more of what the caller asked for just before
CONTINUATIONS = ("too", "also", "as well", "another", "plus")
RETRACTIONS = ("never mind", "nevermind", "forget it", "forget about it", "don't bother", "no thanks",
               "not now", "leave it", "keep it as", "i'll keep it", "let me think", "i'll think", "let me ask", "not today",
               "we'll just walk in", "let's not", "hold off", "let me check", "i'll check", "need to check",
               "have to check", "i already have", "in the store", "in store", "myself", "elsewhere",
               "somewhere else", "on my own", "i'll stay", "stay where", "as it is", "as is")  # fmt: skip
# Clauses that are a retraction only on their own ("keep it" retracts; "keep it at sixteen hundred" does not).
BARE_RETRACTIONS = frozenset({"keep it", "leave it", "no thanks", "never mind"})
_SETTING = frozenset("at to under below above on for around as".split())
# A clause of only these words, with a negation among them, takes the request back ("no wait, don't").
BARE_NEGATION = frozenset("no nope wait don't dont do not that it stop actually please".split())
CORRECTIONS = re.compile(
    r"\b(?:no wait|wait no|no no|no sorry|sorry|actually|i mean|scratch that|on second thought|make that|"
    r"or rather|hmm no|oh wait)\b"
)
FILLERS = frozenset(
    "um uh uhm er erm hmm mm mhm ah oh so and okay ok well yeah yes like alright right look honestly".split()
)


_NOT_NOUNS = frozenset("from with that this only when just".split())


def _has(phrase: str, text: str) -> bool:
    return re.search(rf"(?<![a-z']){re.escape(phrase)}(?![a-z'])", text) is not None


def clauses(text: str) -> list[str]:
    """The question cut at punctuation, "but" and self-corrections ("no wait", "actually", dropped)."""
    text = text.lower().replace("’", "'").replace("—", ",").replace("…", ",")
    parts = re.split(r"[,.;!?]+|\s-\s|\bbut\b", text)
    out: list[str] = []
    for part in parts:
        for piece in CORRECTIONS.split(part):  # the correction words themselves are dropped
            clause = " ".join(words(piece))
            if clause:
                out.append(clause)
    return out


def _vocabulary(spec: ToolSpec, phrases: Sequence[str]) -> tuple[list[str], set[str]]:
    """(phrases that ask for the action, stems of the tool's nouns)."""
    name_words = [
        w for w in re.split(r"[^a-z]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", spec.name).lower()) if w
    ]
    described = words(spec.description)[:3]
    custom = spec.meta.get("phrases") if isinstance(spec.meta, Mapping) else None
    out = [str(p).lower() for p in (custom or ())] + [str(p).lower() for p in phrases]
    # the tool's object ("order" in cancel_order) is a noun there, not a verb; its request words still count
    objects = set(name_words[1:]) if name_words[:1] and name_words[0] in ACTION_PHRASES else set()
    for word in name_words + described:
        if word in ACTION_PHRASES:
            out.extend(p for p in (word, *ACTION_PHRASES[word]) if p not in objects)
    nouns = {
        stem(w) for w in name_words if w not in ACTION_PHRASES and len(w) > 2 and w not in ("the", "call")
    }
    # the things the description names in brackets: "(passport, driver license, ...)"
    for inside in re.findall(r"\(([^)]*)\)", spec.description):
        nouns |= {stem(w) for w in words(inside) if len(w) > 3 and w not in _NOT_NOUNS}
    if not out:  # an unknown verb: the caller has to use the tool's own first word
        out = [w for w in name_words if len(w) > 3][:1]
    return list(dict.fromkeys(out)), nouns


def _matches(phrase: str, clause: str, clause_stems: list[str]) -> int | None:
    """Where `phrase` occurs in the clause (by words, or by stems for one-word phrases), or None."""
    m = re.search(rf"(?<![a-z']){re.escape(phrase)}(?:s|es|d|ed|ing)?(?![a-z'])", clause)
    if m:
        return len(clause[: m.start()].split())
    if " " not in phrase:
        target = stem(phrase)
        for i, s in enumerate(clause_stems):
            if s == target:
                return i
    return None


# Words that start a new request inside an unpunctuated clause; a negation before them is not this verb's.
RESETS = frozenset("just please so then now okay ok alright".split())
RESET_FRAMES = frozenset(
    (a, b) for a in ("can", "could", "would", "will", "let") for b in ("you", "i", "me", "we", "us")
)


def _doubted(clause: str, at: int) -> bool:
    tokens = clause.split()
    before = tokens[max(0, at - 6) : at]
    resets = [i for i, t in enumerate(before) if t in RESETS]
    # "I don't recognise it can I talk to billing": a request frame starts a new request too
    resets += [i + 1 for i, pair in enumerate(itertools.pairwise(before)) if pair in RESET_FRAMES]
    if resets:  # "this isn't working, just put me through": a new request starts after "just"
        before = before[max(resets) + 1 :]
    after = " ".join(tokens[at + 1 : at + 4])
    window = " ".join(before)
    if any(_has(p, clause) for p in POLITE):
        return False
    negated = any(t in NEGATIONS for t in before) and not _has("don't forget", window)
    return negated or any(_has(d, clause) for d in DOUBTS) or _has("yet", after) or _has("later", after)


def _info_question(clause: str) -> bool:
    """A question about something ("what's the policy", "do I need...", "is it..."), not a request."""
    tokens = [t for t in clause.split() if t not in FILLERS]
    if not tokens or any(_has(p, clause) for p in POLITE):
        return False
    first = tokens[0].split("'")[0]
    if first in WH_WORDS:
        return True
    subject = tokens[1] if len(tokens) > 1 else ""
    return first in AUXILIARIES and (
        subject in SUBJECTS or (subject == "it" and first not in ("has", "have"))
    )


def _value_words(arguments: Mapping[str, Any] | None, results: Sequence[str] = ()) -> set[str]:
    """Stems of the call's own values, and of what a tool result calls an id value ("P-3300 phone case")."""
    out: set[str] = set()
    for value in (arguments or {}).values():
        if isinstance(value, str) and not value.replace(".", "").isdigit():
            out |= {stem(w) for w in identifier_words(value) if len(w) > 2}
            if any(ch.isdigit() for ch in value):
                for text in results:
                    at = text.find(value)
                    if at >= 0:
                        name = re.split(r"[;,.()]", text[at + len(value) :], maxsplit=1)[0]
                        out |= {s for s in stems(name)[:4] if len(s) > 2 and not s.isdigit()}
    return out


def _clause_verdict(
    clause: str, verbs: list[str], nouns: set[str], values: set[str], leaving: bool
) -> tuple[str | None, str]:
    """("ask" | "refuse" | None, the phrase that decided)."""
    if any(_has(r, clause) for r in RETRACTIONS):
        return "refuse", "retraction"
    content = [t for t in clause.split() if t not in FILLERS]
    if " ".join(content) in BARE_RETRACTIONS or (
        " ".join(content[:2]) in BARE_RETRACTIONS and (content[2:3] or [""])[0] not in _SETTING
    ):
        return "refuse", "retraction"
    tokens = set(clause.split())
    if tokens <= BARE_NEGATION and tokens & {"don't", "dont", "not", "stop"}:
        return "refuse", "retraction"
    if leaving and any(_has(s, clause) for s in STAY):
        return "refuse", "not leaving"
    clause_stems = stems(clause)
    info = _info_question(clause)
    for phrase in verbs:
        at = _matches(phrase, clause, clause_stems)
        if at is not None:
            if _doubted(clause, at) or info:
                return "refuse", phrase
            if _someone_else(clause.split()[max(0, at - 4) : at]):
                return "refuse", f"{phrase} (said of someone else)"  # "my husband set the cable bill..."
            return "ask", phrase
    framed = any(_has(f, clause) for f in FRAMES) and not any(w in INFO_WORDS for w in clause.split())
    content = [t for t in clause.split() if t not in FILLERS and t not in ("the", "a", "an", "my")]
    # "table for four", "autopay on the insurance": the tool's noun as the whole request
    elliptical = len(content) > 1 and stem(content[0]) in nouns and content[1] in ("for", "on", "to")
    if (
        (elliptical or framed or _generic_verb(clause, nouns | values))
        and not info
        and not set(clause.split()) & STORY  # "my last oil change was a Wednesday": a story, not a request
        and (nouns | values) & set(clause_stems)
    ):
        if any(t in NEGATIONS for t in clause.split()):
            return "refuse", "negated request"
        return "ask", "request"
    return None, ""


def _generic_verb(clause: str, targets: set[str]) -> bool:
    """A generic verb with the tool's noun or the call's value within the next four words ("go premium")."""
    tokens = clause.split()
    for verb in GENERIC_VERBS:
        n = len(verb.split())
        for i in range(len(tokens) - n + 1):
            if " ".join(tokens[i : i + n]) == verb:
                if {stem(t) for t in tokens[i + n : i + n + 4]} & targets:
                    return True
    return False


def asked_for(
    spec: ToolSpec,
    question: str,
    *,
    earlier: Sequence[str] = (),
    phrases: Sequence[str] = (),
    arguments: Mapping[str, Any] | None = None,
    results: Sequence[str] = (),
) -> tuple[bool, str]:
    """Whether the caller's words ask for `spec`'s action: `(True, phrase)` or `(False, reason)`.

    `results` (earlier tool results) only name the call's id values ("P-3300 phone case"), so the caller
    can ask for "two phone cases"; they never ask for anything themselves."""
    verbs, nouns = _vocabulary(spec, phrases)
    values = _value_words(arguments, results)
    leaving = any(w in ("end", "hang") for w in re.split(r"[^a-z]+", spec.name.lower()))
    state: str | None = None
    why = ""
    for clause in clauses(question):
        verdict, phrase = _clause_verdict(clause, verbs, nouns, values, leaving)
        follow_up = any(_has(c, clause) for c in (*CONFIRMATIONS, *CONTINUATIONS))
        if verdict is None and state is None and follow_up and not _info_question(clause):
            if any(asked_for(spec, e, phrases=phrases, arguments=arguments)[0] for e in earlier[-3:]):
                verdict, phrase = "ask", "confirmation"
        if verdict is not None:
            state, why = verdict, phrase
    if state is None and not any(_info_question(c) for c in clauses(question)):
        # frame and noun in different clauses: "new driver's license number, L3302, please record that"
        whole = " ".join(clauses(question))
        targets = nouns | values
        framed = any(_has(f, whole) for f in FRAMES) or _generic_verb(whole, targets)
        if (
            framed
            and targets & set(stems(whole))
            and not set(whole.split()) & (NEGATIONS | INFO_WORDS | STORY)
        ):
            state, why = "ask", "request"
    if state is None and _gives_the_call(spec, question, arguments):
        state, why = "ask", "the caller gave the call's own values"
    if state == "ask":
        return True, why
    if state == "refuse":
        return False, f"the caller did not ask for {spec.name!r} ({why})"
    return False, f"the caller did not ask for {spec.name!r}"


def _gives_the_call(spec: ToolSpec, question: str, arguments: Mapping[str, Any] | None) -> bool:
    """A request said as its own details: "two people tomorrow at eight thirty, the name's Alvarez", "drop me
    down to the basic one". The caller's words in this question give the call's values themselves (at least
    two of them, or the only one; a schema choice or identifier like `max_price` need not be said when a
    value is), as a request: no question, negation, doubt or retraction anywhere, and not a story about the
    past or about someone else ("we were there last Friday at seven", "my sister has premium")."""
    properties = spec.parameters.get("properties", {}) if isinstance(spec.parameters, dict) else {}

    def schema(key: str) -> dict[str, Any]:
        item = properties.get(key) if isinstance(properties, dict) else None
        return item if isinstance(item, dict) else {}

    counted = [
        (key, value)
        for key, value in (arguments or {}).items()
        if value not in (None, "") and schema(key).get("default", object()) != value
    ]
    values = [
        (k, v) for k, v in counted if not ("enum" in schema(k) or (isinstance(v, str) and _CODE.fullmatch(v)))
    ]
    counted = values or counted
    if not counted:
        return False
    parts = clauses(question)
    text = " ".join(parts)
    if "?" in question or any(_info_question(c) or _asks_something(c) for c in parts):
        return False
    own = {stem(w) for _k, v in counted if isinstance(v, str) for w in identifier_words(v)}
    tokens = [t for t in text.split() if stem(t) not in own]
    if set(tokens) & (NEGATIONS | INFO_WORDS | PAST | OTHERS | {"yet", "tell"}):
        return False
    if any(len(t) > 4 and t.endswith("ed") and not t.endswith(("eed", "hundred")) for t in tokens):
        return False
    if _someone_else(tokens):
        return False
    if any(_has(d, text) for d in (*DOUBTS, *RETRACTIONS)):
        return False
    said = Grounding.of(question, [], [question])
    given = sum(1 for key, value in counted if grounded(spec, key, value, said, choices=False))
    return given >= min(2, len(counted))


# Words of a story about the past or about someone else, not a request: they veto `_gives_the_call`.
PAST = frozenset(
    """was were had did last yesterday ago previously used told paid came went got gave took made bought sent
    flew ate saw left found thought kept brought said spent lost broke wrote drove""".split()
)
OTHERS = frozenset("he she they his her their him them".split())
# The unambiguous ones ("paid" is also "I'd like it paid automatically"): they veto a request frame too.
STORY = frozenset("was were had did last yesterday ago previously used".split())
_KIN = "sister|brother|wife|husband|mom|mother|dad|father|friend|son|daughter|boss|partner|neighbor|roommate"
_CODE = re.compile(r"[a-z]+(?:_[a-z]+)+")


def _someone_else(before: list[str]) -> bool:
    """Words before a verb that make someone other than the caller or the agent its subject."""
    text = " ".join(before)
    return bool(set(before) & OTHERS) or re.search(rf"\bmy (?:{_KIN})\b", text) is not None


def _asks_something(clause: str) -> bool:
    """A clause said as a question without its question mark: "is Portland pet friendly", "has it shipped";
    not "can you cap it at fifteen hundred" (a request said politely)."""
    tokens = [t for t in clause.split() if t not in FILLERS]
    if not tokens:
        return False
    first = tokens[0].split("'")[0]
    if first in ("can", "could", "would", "will") and tokens[1:2] and tokens[1] in ("you", "we", "i", "u"):
        return False
    return first in WH_WORDS | AUXILIARIES | {"can", "could", "will", "would"}


def mentioned_in(spec: ToolSpec, texts: Sequence[str]) -> bool:
    """Whether tool outputs name this tool or its verb ("call end_call", "enable autopay", "book it now"):
    then only the keyword check, on the caller's own words, may allow it."""
    name_words = [w for w in re.split(r"[^a-z]+", spec.name.lower()) if w]
    forms = {spec.name.lower(), " ".join(name_words)}
    verbs = {stem(w) for w in name_words[:1]} | {stem(w) for w in words(spec.description)[:1]}
    for text in texts:
        low = text.lower()
        if any(f in low for f in forms) or verbs & set(stems(text)):
            return True
    return False
