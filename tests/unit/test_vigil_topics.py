"""The client-side topic matcher follows RabbitMQ's topic exchange rules."""

import pytest

from vigil.errors import UsageError
from vigil.topics import Subscriptions, check_pattern, matches


@pytest.mark.parametrize(
    ("pattern", "key"),
    [
        ("task.failed_on_cluster.j-1", "task.failed_on_cluster.j-1"),
        ("task.*.j-1", "task.completed.j-1"),
        ("task.failed_on_cluster.*", "task.failed_on_cluster.j-abc"),
        ("*.*.*", "job.failed.j-1"),
        ("#", "job.failed.j-1"),
        ("#", "job"),
        ("job.#", "job"),
        ("job.#", "job.failed"),
        ("job.#", "job.failed.j-1"),
        ("#.j-1", "log.error.j-1"),
        ("#.j-1", "j-1"),
        ("log.#.j-1", "log.j-1"),
        ("log.#.j-1", "log.error.j-1"),
        ("#.error.#", "log.error.j-1"),
        ("*.#", "job"),
        ("#.#", "job.failed"),
    ],
)
def test_when_the_key_fits_the_pattern__it_matches(pattern: str, key: str) -> None:
    assert matches(pattern, key)


@pytest.mark.parametrize(
    ("pattern", "key"),
    [
        ("task.failed_on_cluster.*", "task.completed.j-1"),
        ("task.*", "task.completed.j-1"),  # `*` is exactly one word
        ("task.*.j-1", "task.j-1"),
        ("*.*.*", "job.failed"),
        ("job.#", "jobs.failed"),
        ("job.*", "job"),
        ("#.j-1", "log.error.j-2"),
        ("log.#.j-1", "log.error.j-1.x"),
        ("task.failed.j-1", "task.failed.j-10"),  # whole words, not prefixes
        ("*", "job.failed"),
        ("task.*.j-1", "task.completed.j-1.extra"),
    ],
)
def test_when_the_key_does_not_fit__it_does_not_match(pattern: str, key: str) -> None:
    assert not matches(pattern, key)


@pytest.mark.parametrize("pattern", ["", "job failed", "job.\n", "log.é", "x" * 256])
def test_when_a_pattern_cannot_be_a_topic__it_is_refused(pattern: str) -> None:
    with pytest.raises(UsageError):
        check_pattern(pattern)


def test_when_callbacks_are_registered__each_event_goes_to_the_matching_ones_in_order() -> None:
    subscriptions: Subscriptions[str] = Subscriptions()
    subscriptions.add("task.failed_on_cluster.*", "resubmit")
    subscriptions.add("#", "audit")
    subscriptions.add("job.*.*", "notify")
    subscriptions.add("#", "audit-2")

    assert subscriptions.handlers_for("task.failed_on_cluster.j-1") == [
        "resubmit",
        "audit",
        "audit-2",
    ]
    assert subscriptions.handlers_for("job.failed.j-1") == ["audit", "notify", "audit-2"]
    assert subscriptions.patterns() == ["task.failed_on_cluster.*", "#", "job.*.*"]


def test_when_nothing_is_registered__there_is_nothing_to_listen_to() -> None:
    with pytest.raises(UsageError, match="on"):
        Subscriptions[str]().patterns()
