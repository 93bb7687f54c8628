"""The body of `PATCH /jobs/{id}`, checked exactly like a submission of the edited job.

The edit is laid over the job as it is and the result validated as a `JobCreate` (with the
type's params, the installed analysers and the input limit), so an edit can never make a job
that could not have been submitted. Which fields may change in which state is
`shared.job_edits`' business (409).
"""

from collections.abc import Collection, Mapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from services.api.schemas import (
    MAX_OUTPUTS,
    MAX_RETENTION_S,
    Command,
    Inputs,
    JobCreate,
    Name,
    OutputName,
    ThrottleLimit,
)
from shared.jobs_repo import Job
from shared.task_types.base import TaskType


class JobEdit(BaseModel):
    """New values for some fields of a job; `policy` names only the fields that change."""

    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    command: Command | None = None
    inputs: Inputs | None = Field(default=None, description="Replaces the held inputs.")
    outputs: list[OutputName] | None = Field(default=None, max_length=MAX_OUTPUTS)
    params: dict[str, Any] | None = None
    policy: dict[str, Any] | None = Field(
        default=None, description="Policy fields to change; the others keep their value."
    )
    max_in_flight: ThrottleLimit = None
    release_per_tick: ThrottleLimit = None
    retention_s: float | None = Field(
        default=None,
        ge=1,
        le=MAX_RETENTION_S,
        description="Purge the job's data this long after it ends; null: keep it until purged"
        " by hand.",
    )

    @model_validator(mode="after")
    def _something(self) -> "JobEdit":
        if not self.model_fields_set:
            raise ValueError("nothing to change: name at least one field")
        nulls = sorted(
            k for k in self.model_fields_set - {"retention_s"} if getattr(self, k) is None
        )
        if nulls:
            raise ValueError(f"{', '.join(nulls)} cannot be null (leave a field out to keep it)")
        return self

    def given(self) -> dict[str, Any]:
        """The fields the edit names, with their values."""
        return self.model_dump(mode="json", include=self.model_fields_set)

    def validated(
        self,
        job: Job,
        task_types: Mapping[str, TaskType],
        max_inputs: int,
        analysers: Collection[str],
    ) -> dict[str, Any]:
        """The new values, normalised; a 422 naming the field when the edited job would not
        be a valid submission."""
        given = self.given()
        policy = {**job.policy, **given.get("policy", {})}
        candidate = {
            "name": given.get("name", job.name),
            "type": job.type,
            "command": given.get("command", job.command),
            "outputs": given.get("outputs", job.outputs),
            "params": given.get("params", job.params),
            "policy": policy,
        }
        if "inputs" in given:
            candidate["inputs"] = given["inputs"]
        try:
            checked = JobCreate.model_validate(candidate)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in errors]
            ) from exc
        checked.check_against(task_types, max_inputs, analysers)
        if "policy" in given:
            given["policy"] = checked.policy.model_dump(mode="json")
        if "params" in given:
            given["params"] = dict(checked.params)
        return given
