"""A job's request of resources and its priority as the api takes them: the body's
checks, a user's priority range, a request no host can hold, and an edit's refusal naming
`resources` once the job is active."""

from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from services.api.schemas.jobs import JobCreate, JobEdit, ResourcesIn, check_priority
from services.api.submission import unsatisfiable, unsatisfiable_warning
from shared.domain.scheduling.resources import Resources
from shared.domain.states import JobState
from shared.operations.job_edits import refusal


def _messages(exc: ValidationError | RequestValidationError) -> str:
    return "; ".join(str(e["msg"]) for e in exc.errors())


def test_a_submission_without_resources_asks_for_one_cpu_at_priority_0() -> None:
    job = JobCreate.model_validate({"command": "true"}).to_new_job(None)

    assert (job.request, job.priority) == (Resources(1000, 0, 0), 0)


def test_a_request_is_kept_in_millicores() -> None:
    body = {"command": "true", "resources": {"cpus": 0.125, "memory_mb": 512, "gpus": 2}}

    job = JobCreate.model_validate(body | {"priority": -5}).to_new_job(None)

    assert (job.request, job.priority) == (Resources(125, 512, 2), -5)


@pytest.mark.parametrize(
    ("resources", "says"),
    [
        ({"cpus": 0}, "greater than 0"),
        ({"cpus": -1}, "greater than 0"),
        ({"cpus": 1025}, "less than or equal to 1024"),
        ({"cpus": 0.0005}, "more than 3 decimals"),
        ({"cpus": True}, "valid number"),
        ({"cpus": "2"}, "valid number"),
        ({"memory_mb": -1}, "greater than or equal to 0"),
        ({"memory_mb": 1.5}, "valid integer"),
        ({"gpus": 65}, "less than or equal to 64"),
        ({"gpus": -1}, "greater than or equal to 0"),
        ({"disk": 1}, "Extra inputs"),
    ],
)
def test_a_malformed_request_is_refused_saying_what_is_wrong(
    resources: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        ResourcesIn.model_validate(resources)

    assert says in _messages(caught.value)


@pytest.mark.parametrize("priority", [1_000_001, -1_000_001, 10**30])
def test_a_priority_beyond_any_range_is_refused_naming_the_range(priority: int) -> None:
    with pytest.raises(ValidationError) as caught:
        JobCreate.model_validate({"command": "true", "priority": priority})

    assert "-1000000 to 1000000" in _messages(caught.value)


@pytest.mark.parametrize("priority", [1.5, "3", True, None])
def test_a_priority_that_is_no_integer_is_refused(priority: Any) -> None:
    with pytest.raises(ValidationError):
        JobCreate.model_validate({"command": "true", "priority": priority})


def test_a_user_sets_a_priority_within_their_range_an_operator_beyond() -> None:
    check_priority(100, is_operator=False, user_range=100)
    check_priority(-100, is_operator=False, user_range=100)
    check_priority(1_000_000, is_operator=True, user_range=100)
    check_priority(None, is_operator=False, user_range=0)

    with pytest.raises(RequestValidationError) as caught:
        check_priority(101, is_operator=False, user_range=100)

    [error] = caught.value.errors()
    assert error["loc"] == ("body", "priority")
    assert "a user may set -100 to 100" in error["msg"]
    assert "operators -1000000 to 1000000" in error["msg"]


def test_a_request_that_no_host_can_hold_names_the_closest_host() -> None:
    hosts = {
        "h-small": Resources(4000, 8192, 0),
        "h-gpu": Resources(8000, 16384, 2),
        "h-big": Resources(64000, 262144, 0),
    }

    assert unsatisfiable(Resources(32000, 0, 0), hosts) is None
    assert unsatisfiable(Resources(128000, 0, 0), {}) is None  # nothing known: not refused
    assert unsatisfiable(Resources(128000, 0, 0), hosts) == (
        "no host can ever hold it: needs 128 cpus; the largest host, h-big, has 64 cpus, 262144 MiB"
    )
    # a GPU request is closest to the host with the most of it, by its scarcest resource
    assert "h-gpu, has 8 cpus, 16384 MiB, 2 gpus" in str(
        unsatisfiable(Resources(1000, 0, 4), hosts)
    )


def test_a_job_accepted_although_no_host_can_hold_it_is_told_why_it_will_wait() -> None:
    why = unsatisfiable(Resources(8000, 0, 0), {"h-1": Resources(2000, 4096, 0)})
    assert why is not None

    warning = unsatisfiable_warning(why)

    assert warning.startswith(
        "resources: no host can ever hold it: needs 8 cpus; the largest host, h-1, has 2 cpus"
    )
    assert "wait (too_large)" in warning and "VIGIL_REFUSE_UNSATISFIABLE" in warning


def test_an_edit_of_an_active_jobs_request_is_refused_naming_resources_not_columns() -> None:
    changes = {"req_millicpus": 2000, "req_gpus": 1, "priority": 5}

    refused = refusal("j-1", JobState.ACTIVE, changes)

    assert refused is not None
    assert refused.why.startswith("job j-1 is active: resources can no longer be changed")
    assert refusal("j-1", JobState.ACTIVE, {"priority": 5}) is None
    assert refusal("j-1", JobState.CONFIGURING, changes) is None


def test_an_edit_may_name_only_a_priority() -> None:
    edit = JobEdit.model_validate({"priority": 7})

    assert edit.given() == {"priority": 7}
    with pytest.raises(ValidationError):
        JobEdit.model_validate({"priority": None})
