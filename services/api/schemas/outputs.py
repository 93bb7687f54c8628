"""Views of a job's outputs (`/jobs/{id}/outputs`); the download is `services.api.harvest`'s."""

from datetime import datetime

from pydantic import BaseModel, Field

from shared.domain.purge_rules import purged_message
from shared.store.jobs_repo import Job
from shared.store.outputs_repo import StoredOutput


class OutputPublic(BaseModel):
    """One output file of a task's latest run."""

    task_id: str
    index: int
    run_number: int
    name: str
    size: int
    sha256: str
    host: str | None
    path: str
    downloadable: bool = Field(
        description="It is in the object store: `GET /tasks/{task_id}/outputs/{name}` gives it."
    )
    not_kept: str | None = Field(description="Why it cannot be downloaded, if it cannot.")
    created_at: datetime
    url: str | None = Field(
        default=None,
        description="Its URL in the object store (null: not there): another job of its owner"
        " names it so, with its sha256, in its `files` or an input's `objects`.",
    )

    @classmethod
    def from_stored(cls, output: StoredOutput, store_url: str) -> "OutputPublic":
        skipped = ("downloadable", "url")
        fields = {n: getattr(output, n) for n in cls.model_fields if n not in skipped}
        stored = output.object_key is not None
        fields["url"] = f"{store_url}/{output.object_key}" if stored else None
        fields["downloadable"] = stored or output.kept
        fields["not_kept"] = (
            None
            if fields["downloadable"]
            else "recorded before outputs were kept in the object store"
        )
        return cls(**fields)


class OutputsPage(BaseModel):
    """Outputs by (task index, name); pass `next_cursor` back as `cursor` (null: done)."""

    items: list[OutputPublic]
    next_cursor: str | None
    purged: str | None = Field(
        default=None,
        description="Set when the job was purged (who, when, why): it has no outputs any more"
        " (their kept bytes and work dirs were deleted), and `items` is empty.",
    )

    @classmethod
    def of_purged(cls, job: Job) -> "OutputsPage":
        """The page of a purged job: no outputs, and why."""
        assert job.purged_at is not None
        gone = purged_message(job.id, job.purged_at, job.purged_by)
        reason = f" ({job.purge_reason})" if job.purge_reason else ""
        return cls(items=[], next_cursor=None, purged=f"{gone}{reason}: its outputs are gone")
