"""Topic patterns that clients may follow on the events exchange: parsing and checking, no I/O.

A pattern is exactly three dot-separated words, `<family>.<word>.<job>` (AMQP topic syntax):

- family: `log`, `job` or `task`;
- word: a severity (`log`), a job outcome (`job`), a task state or a triage verdict (`task`),
  or `*`;
- job: a well-formed job id, `*` (any one job) or `#` (as the whole word only).

Anything else is refused with `InvalidTopic` naming the pattern, so user text never reaches a
binding unchecked.
"""

from dataclasses import dataclass
from typing import Final

from shared.domain.analyser import Verdict
from shared.domain.ids import is_safe_id
from shared.domain.messages import JobOutcome, Severity
from shared.domain.states import TaskState

#: Most patterns one subscription may name.
MAX_TOPICS: Final = 20
#: Longest pattern accepted (a real one is under 60 characters).
MAX_TOPIC_CHARS: Final = 200

WILDCARDS: Final = frozenset({"*", "#"})

#: The middle words each family publishes.
FAMILY_WORDS: Final[dict[str, frozenset[str]]] = {
    "log": frozenset(s.value for s in Severity),
    "job": frozenset(o.value for o in JobOutcome),
    "task": frozenset(s.value for s in TaskState) | frozenset(v.value for v in Verdict),
}


class InvalidTopic(ValueError):
    """A pattern that is not `<family>.<word>.<job>` as described in the module docstring."""


@dataclass(frozen=True)
class Topic:
    """A checked pattern; `job` is None when its job word is a wildcard."""

    family: str
    word: str
    job_word: str

    @property
    def pattern(self) -> str:
        """The binding key for the events exchange."""
        return f"{self.family}.{self.word}.{self.job_word}"

    @property
    def job(self) -> str | None:
        """The job id it names, or None for `*` / `#`."""
        return None if self.job_word in WILDCARDS else self.job_word


def parse(pattern: str) -> Topic:
    """The `Topic` of `pattern`; raises `InvalidTopic` saying what is wrong with it."""
    shown = repr(pattern[:100])
    if len(pattern) > MAX_TOPIC_CHARS:
        raise InvalidTopic(f"topic {shown} is longer than {MAX_TOPIC_CHARS} characters")
    words = pattern.split(".")
    if len(words) != 3:
        raise InvalidTopic(
            f"topic {shown} must be three dot-separated words: <family>.<word>.<job id>"
        )
    family, word, job_word = words
    known = FAMILY_WORDS.get(family)
    if known is None:
        families = ", ".join(sorted(FAMILY_WORDS))
        raise InvalidTopic(f"topic {shown}: family {family[:50]!r} is not one of {families}")
    if word != "*" and word not in known:
        raise InvalidTopic(
            f"topic {shown}: {word[:50]!r} is not a {family} word; use '*' or one of "
            + ", ".join(sorted(known))
        )
    if job_word not in WILDCARDS and not is_safe_id(job_word):
        raise InvalidTopic(f"topic {shown}: {job_word[:70]!r} is not a job id, '*' or '#'")
    return Topic(family, word, job_word)


def parse_all(patterns: list[str]) -> list[Topic]:
    """Every pattern checked (duplicates dropped, order kept); raises `InvalidTopic`."""
    if not patterns:
        raise InvalidTopic("name at least one topic, e.g. topic=job.*.*")
    if len(patterns) > MAX_TOPICS:
        raise InvalidTopic(f"{len(patterns)} topics given; at most {MAX_TOPICS} are accepted")
    topics: dict[str, Topic] = {}
    for pattern in patterns:
        topic = parse(pattern)
        topics.setdefault(topic.pattern, topic)
    return list(topics.values())
