"""Bodies and views of the account routes (`/admin/users`, `/admin/tokens`): operators manage
users and their tokens. A token is shown once, when it is made; afterwards only its public id."""

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from services.api import json_values
from shared import users_repo
from shared.users_repo import TokenSummary, UserSummary

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

    @classmethod
    def of(cls, found: UserSummary) -> "UserPublic":
        return cls(
            name=found.user.name,
            role=found.user.role,
            tokens=found.tokens,
            created_at=found.created_at,
            disabled_at=found.disabled_at,
        )


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
