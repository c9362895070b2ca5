"""How well a new goal matches learned flows: the local lexical scorer (no model, no download)
and the rules every scorer shares (goal parameters, opposite wording).

Lexical score, 0..1, for goal g and flow f:
* g is first bound to f's goal template (`params.bind`): "Create a contact named Alan Turing
  with phone 555 0111" becomes "Create a contact named {p1} with phone {p2}" against a flow
  learned from Ada Lovelace, so a goal that differs only in its parameters scores 1;
* 0.8 × the smaller of two coverages, by IDF weight (over the flows' templates and embedding
  texts): how much of g the template has, and how much of the template g has — so a goal that
  asks for more than the flow did ("Turn on dark theme and enable battery saver" against a
  flow for "Turn on dark theme") or less scores low, however much they share; words that only
  say which way a goal goes (on/off, enable/disable, add/delete) weigh nothing here (the
  opposite-wording rule below decides them), generic verbs (turn, switch, set) half;
* plus 0.2 × how much of g the flow's embedding text covers (its steps' purposes, expected
  outcomes and target semantics: "Show the battery percentage" finds the words its steps
  used).

Shared rules, whatever scored: a flow whose template holds the opposite wording of the goal
("turn off" against "turn on", or as many directions with one turned) is never a match, nor is
one that went one way for a goal that goes both ("turn on … then turn it off"), a flow
that types a parameter the goal does not supply (a `secret…`, or a slot the goal does not
fill) is not usable, and neither is one whose slot would take more of the goal than a value
("Create a contact named Bob, then delete it" against "Create a contact named {p1}").
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from planner.flows import params

GOAL_WEIGHT = 0.8
_TOKEN = re.compile(r"\{p\d+\}|[\w%]+", re.UNICODE)
STOPWORDS = frozenset(
    {
        "a",
        "an",
        "the",
        "to",
        "of",
        "in",
        "for",
        "my",
        "me",
        "i",
        "please",
        "and",
        "then",
        "with",
        "by",
        "it",
        "its",
        "this",
        "that",
        "is",
        "be",
        "at",
        "as",
        "from",
        "into",
    }
)
#: Words that decide which way a goal goes; a flow with the opposite one is never a match.
POLARITY: dict[str, int] = {
    **dict.fromkeys(("on", "enable", "enabled", "activate", "show", "add", "create", "allow"), 1),
    **dict.fromkeys(
        ("off", "disable", "disabled", "deactivate", "hide", "delete", "remove", "deny", "stop"),
        -1,
    ),
}
#: Verbs nearly every goal starts with: they say little about which flow fits.
GENERIC = frozenset(["turn", "switch", "set", "go", "open", "make", "put", "use", "get", "want"])


def tokens(text: str) -> list[str]:
    """Lower-case words and {pN} slots of `text`, stop words left out."""
    return [t.lower() for t in _TOKEN.findall(text) if t.lower() not in STOPWORDS]


@functools.lru_cache(maxsize=8192)
def directions(text: str) -> tuple[int, ...]:
    """Which way each direction word of the text goes, in order (+1 on/enable/add…, -1
    off/disable/delete…); kept per text, as retrieval asks it of every active flow's template
    for each goal."""
    return tuple(POLARITY[t] for t in tokens(text) if t in POLARITY)


def opposite(goal: str, template: str) -> bool:
    """The goal goes one way and the template only the other ("turn on" vs "turn off"), or
    both say as many directions and one differs: "Turn off dark theme and turn on battery
    saver" is not what a flow for "Turn on dark theme and turn off battery saver" did, though
    each goes both ways (a flow replayed for it would turn dark theme on)."""
    g, t = directions(goal), directions(template)
    if not g or not t:
        return False
    return not set(g) & set(t) or (len(g) == len(t) and g != t)


#: "on" that says where or when, not which way ("Turn off Wi-Fi on my phone", "the alarm on
#: Monday"): not right after a verb it completes ("turn on the flashlight"), and before a
#: determiner, a possessive or a day.
_PLACE_ON = re.compile(
    r"(?<!\bturn )(?<!\bswitch )(?<!\btoggle )\bon\s+(?=(?:the|my|a|an|this|that|your|our|"
    r"its|his|her|their|every|each|\w+day)\b)",
    re.I,
)


def both_ways(goal: str, template: str) -> bool:
    """The goal goes both ways and the template one ("Turn on dark theme and then turn it
    off" against "Turn on dark theme"): direction words weigh nothing in the score, so such a
    goal scored as the flow's own, and its replay reported success for half of it. An "on"
    that says where ("on my phone") is no direction."""
    g, t = set(directions(_PLACE_ON.sub("", goal))), set(directions(template))
    return len(g) == 2 and len(t) == 1


@dataclass(frozen=True, slots=True)
class Candidate:
    """One flow as retrieval sees it."""

    flow_id: str
    goal_template: str
    embedding_text: str
    needed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Scored:
    """A flow's score for a goal and whether it may be used (`why` when not)."""

    flow_id: str
    score: float
    values: dict[str, str] = field(default_factory=dict)
    why: str = ""

    @property
    def usable(self) -> bool:
        return not self.why


#: Verbs a goal's further step starts with, after a connective (`_MORE_GOAL`), as alternatives.
_GOAL_VERBS = (
    "turn|switch|set|open|go|make|put|use|get|call|dial|delete|remove|create|add|enable|"
    "disable|show|hide|launch|close|send|text|message|play|start|stop|install|uninstall|"
    "share|save|change|type|search|find|clear|reset|rename|move|copy|block|allow|deny|tap|"
    "press|select|check|uncheck|activate|deactivate|edit|update|write|record|mute|unmute|"
    "connect|disconnect|pair|join|leave"
)
#: Where a slot's value goes on with more of the goal rather than ends: a connective and a
#: verb ("named Bob, then delete it", "for 7:00 and turn on dark theme"), or another app
#: ("named Bob in the Notes app"). The last slot takes the rest of a goal, and its flow, which
#: did only the first part, scored 1 and replayed it (a contact named "Bob, then delete it").
_MORE_GOAL = re.compile(
    r"(?:[,;]|\band\b|\bthen\b)\s*(?:and\s+)?(?:then\s+)?(?:"
    + _GOAL_VERBS
    + r")\b|\b(?:in|on|using|with|from|via)\s+(?:the\s+)?\S+(?:\s+\S+)?\s+app\b",
    re.I,
)


def bound(candidate: Candidate, goal: str) -> tuple[dict[str, str], str]:
    """The parameter values `goal` gives the flow, and why it is unusable ("" when usable)."""
    # A template without slots binds no values whether or not the goal matches it.
    slots = params.SLOT.search(candidate.goal_template) is not None
    values = (params.bind(candidate.goal_template, goal) if slots else None) or {}
    # the goal's own words decide its direction, not its values ("a contact named Stop Watch")
    said = params.slotted(goal, values) if values else goal
    if opposite(said, candidate.goal_template):
        return values, "the goal asks the opposite of what the flow did"
    if both_ways(said, candidate.goal_template):
        return values, "the goal goes both ways (on and off) and the flow one: it asks more"
    # A value that reads as more of the goal: a false match costs a model run, a missed one a
    # wrong action reported as success.
    more = next(((n, v) for n, v in values.items() if _MORE_GOAL.search(v)), None)
    if more is not None:
        return values, (
            f"the goal goes on past its value for {more[0]} ({more[1][:80]!r}): it asks more "
            "than the flow did"
        )
    missing = params.missing(candidate.needed, values)
    if missing:
        return values, f"it needs {', '.join(missing)}, which the goal does not give"
    return values, ""


class LexicalScorer:
    """TF-IDF over the candidates' templates and embedding texts; see the module docstring."""

    name = "lexical"

    def __init__(self, candidates: Sequence[Candidate]) -> None:
        self.candidates = list(candidates)
        # What `score` needs of each candidate whatever the goal, worked out once: a retrieval
        # scores one goal against every active flow, and the cloud keeps a scorer while its
        # flows stand still (cloud/flows/retrieval.py).
        self._docs = [
            frozenset(tokens(c.goal_template + " " + c.embedding_text)) for c in self.candidates
        ]
        df = Counter(t for d in self._docs for t in d)
        n = len(self._docs)
        self._idf = {t: math.log((n + 1) / (c + 1)) + 1.0 for t, c in df.items()}
        self._default_idf = math.log(n + 1) + 1.0
        self._templates = [frozenset(tokens(c.goal_template)) for c in self.candidates]
        self._template_vectors = [self._vector(tokens(c.goal_template)) for c in self.candidates]

    def _weight(self, token: str) -> float:
        if token in POLARITY:
            return 0.0
        scale = 0.5 if token in GENERIC else 1.0
        return self._idf.get(token, self._default_idf) * scale

    def _vector(self, words: Iterable[str]) -> dict[str, float]:
        counts = Counter(words)
        return {t: c * w for t, c in counts.items() if (w := self._weight(t))}

    @staticmethod
    def _covered(part: Mapping[str, float], have: AbstractSet[str]) -> float:
        """The share of `part`'s weight whose words `have` holds."""
        total = sum(part.values())
        return sum(v for t, v in part.items() if t in have) / total if total else 0.0

    def score(self, goal: str) -> list[Scored]:
        """Every candidate's score for `goal`, best first."""
        out: list[Scored] = []
        goal = params.without_closing(goal)
        plain = tokens(goal)
        plain_words, plain_vector = frozenset(plain), self._vector(plain)
        for n, c in enumerate(self.candidates):
            values, why = bound(c, goal)
            if values:
                query = tokens(params.slotted(goal, values))
                words, q = frozenset(query), self._vector(query)
            else:
                words, q = plain_words, plain_vector
            both_ways = min(
                self._covered(q, self._templates[n]),
                self._covered(self._template_vectors[n], words),
            )
            steps = self._covered(q, self._docs[n])
            score = GOAL_WEIGHT * both_ways + (1 - GOAL_WEIGHT) * steps
            out.append(Scored(c.flow_id, round(min(1.0, score), 4), values, why))
        out.sort(key=lambda s: s.score, reverse=True)
        return out


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two embedding vectors (0 when either is empty or mismatched)."""
    if not a or len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
