"""Bodies and views of `/admin`: users and tokens, the emergency stop and its resume."""

from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from services.api import json_values
from services.api.schemas.common import TEXT_PATTERN
from shared.domain import store_quota
from shared.operations.emergency import Resumed, Stop
from shared.store import users_repo
from shared.store.users_repo import TokenSummary, UserSummary

#: A token's public id: `k-` and 12 hex digits.
TOKEN_ID_PATTERN = r"^k-[0-9a-f]{12}$"


def _check_label(label: str) -> str:
    problem = json_values.text_problem(label)
    if problem:
        raise ValueError(f"label {problem}")
    return label


Label = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_check_label)]


class NewUser(BaseModel):
    """The body of `POST /admin/users`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=users_repo.NAME_PATTERN,
        description="1 to 64 letters, digits or '._@-', starting with a letter or digit.",
    )
    role: Literal["user", "operator"] = Field(default="user")
    label: Label | None = Field(default=None, description="What the first token is for.")


class NewToken(BaseModel):
    """The body of `POST /admin/users/{name}/tokens`."""

    model_config = ConfigDict(extra="forbid")

    label: Label | None = Field(default=None, description="What the token is for.")


class UserPublic(BaseModel):
    """A user: never a token, only how many live ones they hold."""

    name: str
    role: str
    tokens: int = Field(description="Tokens not revoked.")
    created_at: datetime
    disabled_at: datetime | None = Field(description="Set: none of the user's tokens works.")
    share: float = Field(
        default=1.0,
        description="Their fair share of the pool: users are served in proportion"
        " to their shares. Operators set it (PATCH /admin/users/{name}).",
    )
    usage: float = Field(
        default=0.0,
        description="Their decayed usage in CPU-seconds (each task's cost: its dominant share"
        " of the pool, in CPUs), as of `usage_at`, as the scheduler last charged it.",
    )
    usage_at: datetime | None = None
    stored_bytes: int = Field(
        default=0,
        description="The bytes they keep in the object store: their tasks' outputs and their"
        " uploads, until purged.",
    )
    store_quota_bytes: int | None = Field(
        default=None,
        description="Their own quota of stored bytes, set by an operator (0: none); null: the"
        " installation's (VIGIL_STORE_QUOTA_BYTES).",
    )
    quota_bytes: int = Field(
        default=0,
        description="The quota of stored bytes in force for them (0: none): past it, jobs that"
        " declare outputs and uploads are refused, and tasks whose outputs would go over fail"
        " (class `quota`).",
    )

    @classmethod
    def of(cls, found: UserSummary, default_quota: int = 0) -> "UserPublic":
        return cls(
            name=found.user.name,
            role=found.user.role,
            tokens=found.tokens,
            created_at=found.created_at,
            disabled_at=found.disabled_at,
            share=found.share,
            usage=found.usage,
            usage_at=found.usage_at,
            stored_bytes=found.stored_bytes,
            store_quota_bytes=found.store_quota_bytes,
            quota_bytes=store_quota.effective(found.store_quota_bytes, default_quota),
        )


#: The largest share an operator may give (a share is a weight: only ratios matter), and the
#: smallest (kept as a 4-byte real: a smaller one could round to 0).
MAX_SHARE: Final = 1_000_000.0
MIN_SHARE: Final = 0.000001


def _check_share(share: float) -> float:
    if not MIN_SHARE <= share <= MAX_SHARE:  # NaN too
        raise ValueError(
            f"share {share!r} is out of range: more than 0, from {MIN_SHARE:g} to"
            f" {MAX_SHARE:,.0f} (a weight: only the ratios of users' shares matter)"
        )
    return share


#: The largest quota of stored bytes an operator may give (8 EiB: a bigint).
MAX_QUOTA_BYTES: Final = 2**62


class UserEdit(BaseModel):
    """The body of `PATCH /admin/users/{name}`: what it names changes, the rest stays."""

    model_config = ConfigDict(extra="forbid")

    share: Annotated[float, Field(strict=True), AfterValidator(_check_share)] | None = Field(
        default=None,
        description="Their fair share, more than 0 (at least 0.000001) and at most 1,000,000"
        " (a weight: a user of share 3 gets three times the pool of one of share 1 when both"
        " wait).",
    )
    store_quota_bytes: Annotated[int, Field(strict=True, ge=0, le=MAX_QUOTA_BYTES)] | None = Field(
        default=None,
        description="Their own quota of stored bytes (0: none); null: the installation's"
        " (VIGIL_STORE_QUOTA_BYTES) again. A lower quota than what they store refuses their"
        " next jobs with outputs and uploads; nothing stored is deleted.",
    )

    @model_validator(mode="after")
    def _names_something(self) -> "UserEdit":
        if not self.model_fields_set:
            raise ValueError("name what to change: share, store_quota_bytes")
        if "share" in self.model_fields_set and self.share is None:
            raise ValueError("share cannot be null")
        return self


class TokenPublic(BaseModel):
    """A token as operators see it: its public id, never the token."""

    id: str = Field(description="Its public id (`k-...`), by which it is revoked.")
    user: str
    label: str | None
    created_at: datetime
    revoked_at: datetime | None = Field(description="Set: the token works no more.")

    @classmethod
    def of(cls, token: TokenSummary) -> "TokenPublic":
        return cls(
            id=token.id,
            user=token.user,
            label=token.label,
            created_at=token.created_at,
            revoked_at=token.revoked_at,
        )


class IssuedToken(BaseModel):
    """A token just made: `token` is shown this once (only its hash is kept)."""

    token: str
    details: TokenPublic


MAX_REASON_CHARS: Final = 500


def _check_reason(reason: str) -> str:
    problem = json_values.text_problem(reason)
    if problem:
        raise ValueError(f"reason {problem}")
    if not reason.strip():
        raise ValueError("reason must not be blank")
    return reason


Reason = Annotated[
    str,
    Field(min_length=1, max_length=MAX_REASON_CHARS, pattern=TEXT_PATTERN),
    AfterValidator(_check_reason),
]


class EmergencyStopRequest(BaseModel):
    """The body of `POST /admin/emergency-stop`: why (kept with the stop and in every brief)."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason = Field(description="Why everything is stopped (1 to 500 characters).")


class EmergencyStopPublic(BaseModel):
    """An emergency stop: who, when, why, what it did, and who resumed it (null: in force)."""

    id: int
    stopped_by: str
    stopped_at: datetime
    reason: str
    jobs_suspended: int
    tasks_killed: int
    resumed_by: str | None
    resumed_at: datetime | None

    @classmethod
    def from_stop(cls, stop: Stop) -> "EmergencyStopPublic":
        return cls(**{name: getattr(stop, name) for name in cls.model_fields})


class EmergencyStatus(BaseModel):
    """`GET /admin/emergency-stop`: the latest stop (null: never any), and whether it holds."""

    in_force: bool
    latest: EmergencyStopPublic | None


class EmergencyResumePublic(BaseModel):
    """What `POST /admin/resume` did: the stop (now resumed), jobs resumed, tasks recovered."""

    stop: EmergencyStopPublic
    jobs_resumed: list[str]
    tasks_recovered: list[str]

    @classmethod
    def from_resumed(cls, resumed: Resumed) -> "EmergencyResumePublic":
        return cls(
            stop=EmergencyStopPublic.from_stop(resumed.stop),
            jobs_resumed=resumed.jobs_resumed,
            tasks_recovered=resumed.tasks_recovered,
        )
