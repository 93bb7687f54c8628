"""Bodies and answers of `/bulk/actions` (global fixes).

The selector is `shared.domain.selectors.TaskSelector` as is (unknown fields and an empty selector
are 422); a record is `shared.store.bulk_repo.BulkRecord` as is, and the answer to an action is that
record with a sample of the tasks it matched.
"""

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.actions import TaskAction
from shared.domain.selectors import TaskSelector
from shared.operations.bulk import BulkRequest, MatchedTask, Outcome
from shared.store.bulk_repo import BulkRecord


class BulkActionRequest(BaseModel):
    """The body of `POST /bulk/actions`: an action for every task the selector matches."""

    model_config = ConfigDict(extra="forbid")

    selector: TaskSelector
    action: TaskAction
    dry_run: bool = Field(
        default=False, description="Count what the action would do; change no task."
    )
    confirm: bool = Field(
        default=False,
        description="Needed (true) to act on more tasks than the api's confirmation threshold.",
    )

    def to_request(self) -> BulkRequest:
        return BulkRequest(self.selector, self.action, self.dry_run, self.confirm)


class BulkActionPublic(BulkRecord):
    """What a bulk action did (its record; a dry run: what it would do). `refusals` counts
    the refused tasks by reason (e.g. `not allowed in state completed`); `sample` holds the
    first 50 matched tasks by job and index, as they were when selected."""

    sample: list[MatchedTask]

    @classmethod
    def from_outcome(cls, outcome: Outcome) -> "BulkActionPublic":
        return cls(**dict(outcome.record), sample=outcome.sample)
