"""Bodies and answers of the control routes (design §9): task and job actions, appended inputs.

Like `schemas`, request bodies forbid unknown fields and every 422 names the field at fault;
the state checks themselves are `shared.actions`' and answer 409.
"""

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from services.api.schemas import (
    Inputs,
    InputValue,
    JobPublic,
    TaskPublic,
    ThrottleLimit,
    count_errors,
)
from shared.actions import JobAction, TaskAction
from shared.configuring import TrialInput


class InputsAppend(BaseModel):
    """The body of `POST /jobs/{id}/inputs`: each input is checked as in `POST /jobs`."""

    model_config = ConfigDict(extra="forbid")

    inputs: Inputs

    def check_against(self, max_inputs: int) -> None:
        """Raise a 422 `RequestValidationError` when more than `max_inputs` inputs are given."""
        errors = count_errors(self.inputs, max_inputs)
        if errors:
            raise RequestValidationError(errors)


class TaskActionRequest(BaseModel):
    """The body of `POST /tasks/{id}/actions` (design §2: recovery and restart)."""

    model_config = ConfigDict(extra="forbid")

    action: TaskAction


class JobActionRequest(BaseModel):
    """The body of `POST /jobs/{id}/actions`; the two limits go with `throttle` only."""

    model_config = ConfigDict(extra="forbid")

    action: JobAction
    max_in_flight: ThrottleLimit = Field(default=None, description="Most tasks running at once.")
    release_per_tick: ThrottleLimit = Field(
        default=None, description="Most new tasks released per scheduler tick."
    )

    @field_validator("max_in_flight", "release_per_tick")
    @classmethod
    def _only_to_throttle(cls, value: int | None, info: ValidationInfo) -> int | None:
        # An invalid action already has its own error: do not add a second one here.
        action = info.data.get("action", JobAction.THROTTLE)
        if value is not None and action is not JobAction.THROTTLE:
            raise ValueError(f"{info.field_name} is only accepted with the action throttle")
        return value

    @model_validator(mode="after")
    def _throttle_needs_a_limit(self) -> "JobActionRequest":
        limits = (self.max_in_flight, self.release_per_tick)
        if self.action is JobAction.THROTTLE and limits == (None, None):
            raise ValueError("throttle needs max_in_flight and/or release_per_tick")
        return self


class TaskActionPublic(BaseModel):
    """What a task action did: the task as it now is, and the task `duplicate` made (else null)."""

    task: TaskPublic
    created: TaskPublic | None


class InputsAdded(BaseModel):
    """The job after an append, and the ids of its new tasks in index order."""

    job: JobPublic
    task_ids: list[str]


class TestRequest(BaseModel):
    """The body of `POST /jobs/{id}/tests`: which input the test task runs on."""

    model_config = ConfigDict(extra="forbid")

    input_index: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="A held input by position (a chained job: the upstream task at that"
        " position); 0 when neither this nor `input` is given.",
    )
    input: InputValue = Field(default=None, description="An explicit test input.")

    @model_validator(mode="after")
    def _one_source(self) -> "TestRequest":
        if self.input_index is not None and "input" in self.model_fields_set:
            raise ValueError("give either input_index or input, not both")
        return self

    def what(self) -> TrialInput:
        """The shared form of this request."""
        if "input" in self.model_fields_set:
            return TrialInput(value=self.input, explicit=True)
        return TrialInput(index=self.input_index or 0)
