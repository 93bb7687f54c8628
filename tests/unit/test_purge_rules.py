"""When a job may be purged: every refusal, in its order, and the sizes in messages."""

from datetime import UTC, datetime

import pytest

from shared.domain.purge_rules import JobFacts, purged_message, refusal
from shared.domain.sizes import human_size
from shared.domain.states import JobState

AT = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED])
def test_when_an_ended_job_is_idle__it_may_be_purged(state: JobState) -> None:
    assert refusal(JobFacts("j-1", state)) is None


@pytest.mark.parametrize(
    "state",
    [s for s in JobState if s not in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)],
)
def test_when_the_job_has_not_ended__the_refusal_names_its_state(state: JobState) -> None:
    refused = refusal(JobFacts("j-1", state))

    assert refused is not None
    message = str(refused)
    assert f"in state {state.value}" in message
    assert "cancelled, completed, failed" in message


def test_when_tasks_are_busy__the_refusal_names_the_first_five_and_says_there_are_more() -> None:
    busy = [(f"t-{i}", "on_cpu") for i in range(6)]

    refused = refusal(JobFacts("j-1", JobState.COMPLETED, busy=busy))

    assert refused is not None
    message = str(refused)
    assert (
        "t-0 (on_cpu), t-1 (on_cpu), t-2 (on_cpu), t-3 (on_cpu), t-4 (on_cpu) and more" in message
    )
    assert "t-5" not in message


def test_when_a_chained_job_runs__the_refusal_names_it() -> None:
    refused = refusal(JobFacts("j-1", JobState.FAILED, downstream=["j-2"]))

    assert refused is not None and "j-2" in refused.why and "and more" not in refused.why


def test_when_the_job_was_purged__that_comes_first() -> None:
    facts = JobFacts("j-1", JobState.ACTIVE, AT, "ops", busy=[("t-1", "on_cpu")])

    refused = refusal(facts)

    assert refused is not None
    assert refused.why == "job j-1 was purged at 2030-01-02T03:04:05+00:00 by ops already"


def test_when_nobody_is_named__the_purged_message_leaves_out_by() -> None:
    assert purged_message("j-1", AT, None) == "job j-1 was purged at 2030-01-02T03:04:05+00:00"


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (1024 * 1024, "1 MiB"),
        (16 * 1024 * 1024, "16 MiB"),
        (3 * 1024**3 + 1, "3 GiB"),
        (2048 * 1024**4, "2048 TiB"),
    ],
)
def test_when_a_size_is_shown__it_is_in_the_largest_unit(count: int, text: str) -> None:
    assert human_size(count) == text


def test_when_a_running_job_is_purged__the_refusal_names_its_tasks_and_how_to_end_it() -> None:
    facts = JobFacts("j-1", JobState.ACTIVE, busy=[("t-1", "on_cpu"), ("t-2", "queued")])

    refused = refusal(facts)

    assert refused is not None
    assert "tasks still running or held: t-1 (on_cpu), t-2 (queued)" in refused.why
    assert "cancel it (`vigil cancel j-1`, or the action cancel)" in refused.next_step
