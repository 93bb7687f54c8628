"""Topic patterns a client may follow: exactly `<family>.<word>.<job>`, nothing else."""

import pytest

from shared.domain.analyser import Verdict
from shared.domain.messages import JobOutcome, Severity
from shared.domain.states import TaskState
from shared.domain.topics import MAX_TOPICS, InvalidTopic, Topic, parse, parse_all


@pytest.mark.parametrize(
    ("pattern", "job"),
    [
        ("job.*.*", None),
        ("task.*.#", None),
        ("log.error.j-3k9x0q7mzt1a", "j-3k9x0q7mzt1a"),
        ("task.on_cpu.*", None),
        ("task.failed_post_processing_prerequisites.j-1", "j-1"),
        ("task.resubmitted.j-1", "j-1"),
        ("job.crashed.#", None),
    ],
)
def test_when_a_pattern_is_well_formed__it_parses_with_its_job(
    pattern: str, job: str | None
) -> None:
    topic = parse(pattern)
    assert topic.pattern == pattern
    assert topic.job == job


def test_every_published_word_is_accepted_in_its_family() -> None:
    for severity in Severity:
        assert parse(f"log.{severity.value}.*").word == severity.value
    for outcome in JobOutcome:
        assert parse(f"job.{outcome.value}.*").word == outcome.value
    for state in TaskState:
        assert parse(f"task.{state.value}.*").word == state.value
    for verdict in Verdict:
        assert parse(f"task.{verdict.value}.*").word == verdict.value


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("", "three dot-separated words"),
        ("job.*", "three dot-separated words"),
        ("job.#", "three dot-separated words"),
        ("job.*.*.*", "three dot-separated words"),
        ("jobs.*.*", "family 'jobs'"),
        ("*.*.*", "family '*'"),
        ("job.#.*", "is not a job word"),
        ("job.on_cpu.*", "is not a job word"),
        ("log.succeeded.*", "is not a log word"),
        ("task.error.*", "is not a task word"),
        ("task.ON_CPU.*", "is not a task word"),
        ("log.error.J-1", "is not a job id"),
        ("log.error.j#", "is not a job id"),
        ("log.error.*x", "is not a job id"),
        ("log.error.", "is not a job id"),
        ("log.error.-j", "is not a job id"),
        ("x" * 201, "longer than"),
    ],
)
def test_when_a_pattern_is_malformed__the_error_names_it_and_why(pattern: str, says: str) -> None:
    with pytest.raises(InvalidTopic) as caught:
        parse(pattern)
    assert repr(pattern[:100]) in str(caught.value)
    assert says in str(caught.value)


def test_when_patterns_repeat__each_is_kept_once_in_order() -> None:
    topics = parse_all(["job.*.*", "log.error.j-1", "job.*.*"])
    assert topics == [Topic("job", "*", "*"), Topic("log", "error", "j-1")]


def test_when_no_pattern_or_too_many__refused() -> None:
    with pytest.raises(InvalidTopic, match="at least one"):
        parse_all([])
    with pytest.raises(InvalidTopic, match=f"at most {MAX_TOPICS}"):
        parse_all([f"job.*.j-{i}" for i in range(MAX_TOPICS + 1)])
    assert len(parse_all([f"job.*.j-{i}" for i in range(MAX_TOPICS)])) == MAX_TOPICS
