"""A user's quota of stored bytes: what they keep in the object store (their tasks' outputs,
their uploads) against their limit, and the refusal that names both. Pure, no I/O; the counts
are kept by `shared/store/quota_repo.py`.

The limit of a user is their own when an operator set one (`PATCH /admin/users/{name}`,
`vigil users quota`), else the installation's (`VIGIL_STORE_QUOTA_BYTES`); 0 is no limit.
"""

from dataclasses import dataclass

from shared.domain.sizes import human_size

#: Where a user's limit comes from, for messages.
SETTING = "VIGIL_STORE_QUOTA_BYTES"


def effective(own: int | None, default: int) -> int:
    """The limit of a user whose own is `own` (None: unset) on an installation whose default is
    `default`; 0: no limit."""
    return default if own is None else own


@dataclass(frozen=True)
class Usage:
    """A user's stored bytes and their limit (0: none)."""

    user: str
    used: int
    limit: int

    def room_for(self, size: int) -> bool:
        """Whether `size` more bytes fit within the limit."""
        return self.limit == 0 or self.used + size <= self.limit

    @property
    def full(self) -> bool:
        """Whether no byte more fits (a job that would store any is refused)."""
        return self.limit != 0 and self.used >= self.limit

    def describe(self) -> str:
        """`alice stores 9.5 MiB (9961472 bytes) of a quota of 10 MiB (10485760 bytes)`."""
        return (
            f"{self.user} stores {human_size(self.used)} ({self.used} bytes) of a quota of"
            f" {human_size(self.limit)} ({self.limit} bytes)"
        )


#: What a user over their quota may do, in every refusal.
NEXT_STEP = (
    "free stored bytes by purging finished jobs (vigil purge JOB), or ask an operator for a"
    " larger quota (vigil users quota NAME SIZE)"
)


class OverQuota(Exception):
    """Storing `size` more bytes would take the user over their quota."""

    def __init__(self, usage: Usage, size: int, what: str) -> None:
        self.usage, self.size, self.what = usage, size, what
        super().__init__(
            f"{what} ({human_size(size)}, {size} bytes) would go over the quota of stored"
            f" bytes: {usage.describe()}"
        )
