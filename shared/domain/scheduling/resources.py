"""Amounts of resources: what a task asks for, what a host has, and what they cost.

CPU is counted in millicores and memory in MiB, both integers: sums of requests are exact,
so no rounding can ever let a host be over-committed. GPUs are a count here; which devices a
task gets is the board's business (`board.py`), since a GPU is never shared.
"""

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of each resource (a request, a capacity, what is free or held)."""

    millicpus: int = 0
    memory_mb: int = 0
    gpus: int = 0

    @classmethod
    def of(cls, cpus: float = 1, memory_mb: int = 0, gpus: int = 0) -> "Resources":
        """From CPUs as people write them (`0.5`, `4`)."""
        return cls(round(cpus * 1000), memory_mb, gpus)

    def fits_in(self, room: "Resources") -> bool:
        """Whether this amount fits in `room`, every resource at once."""
        return (
            self.millicpus <= room.millicpus
            and self.memory_mb <= room.memory_mb
            and self.gpus <= room.gpus
        )

    def __add__(self, other: "Resources") -> "Resources":
        return Resources(
            self.millicpus + other.millicpus,
            self.memory_mb + other.memory_mb,
            self.gpus + other.gpus,
        )

    def __sub__(self, other: "Resources") -> "Resources":
        return Resources(
            self.millicpus - other.millicpus,
            self.memory_mb - other.memory_mb,
            self.gpus - other.gpus,
        )

    def times(self, count: int) -> "Resources":
        """`count` tasks of this request."""
        return Resources(self.millicpus * count, self.memory_mb * count, self.gpus * count)

    def at_least_zero(self) -> "Resources":
        """Each resource clamped at zero: a caller's accounting may run a little behind (a
        task ended but not yet counted), and a negative amount must never look like room."""
        if self.millicpus >= 0 and self.memory_mb >= 0 and self.gpus >= 0:
            return self  # an amount never changes: the same one will do
        return Resources(max(self.millicpus, 0), max(self.memory_mb, 0), max(self.gpus, 0))

    def as_json(self) -> dict[str, float | int]:
        """`{"cpus": 0.5, "memory_mb": 0, "gpus": 0}`: as the API shows an amount."""
        return {"cpus": self.millicpus / 1000, "memory_mb": self.memory_mb, "gpus": self.gpus}

    def describe(self) -> str:
        """`2 cpus, 4096 MiB, 1 gpu`: what a waiting reason shows (memory and GPUs when
        asked for or had)."""
        parts = [f"{self.millicpus / 1000:g} cpu" + ("" if self.millicpus == 1000 else "s")]
        if self.memory_mb:
            parts.append(f"{self.memory_mb} MiB")
        if self.gpus:
            parts.append(f"{self.gpus} gpu" + ("" if self.gpus == 1 else "s"))
        return ", ".join(parts)


NOTHING = Resources()


def total(amounts: Iterable[Resources]) -> Resources:
    """The sum of `amounts` (a round adds up a thousand hosts' capacities: one amount made,
    not one per host)."""
    millicpus = memory_mb = gpus = 0
    for amount in amounts:
        millicpus += amount.millicpus
        memory_mb += amount.memory_mb
        gpus += amount.gpus
    return Resources(millicpus, memory_mb, gpus)


def coverage(need: Resources, room: Resources) -> float:
    """How much of `need` fits in `room`, by its scarcest resource (1.0 or more: all of it):
    how close a host comes to holding a request, to name the closest one in a reason and to
    choose the host to hold for a reservation (the one with the least left to drain)."""
    parts = [
        room_part / need_part
        for need_part, room_part in (
            (need.millicpus, room.millicpus),
            (need.memory_mb, room.memory_mb),
            (need.gpus, room.gpus),
        )
        if need_part > 0
    ]
    return min(parts, default=1.0)


@dataclass(frozen=True, slots=True)
class Pricing:
    """What resources cost, in CPUs: a task's cost is its dominant share of the pool (Dominant
    Resource Fairness) expressed in the pool's CPUs. A task of 1 CPU and half the pool's
    memory per CPU costs 1; one that takes a GPU costs the pool's CPUs per GPU. So a user of
    GPUs or of memory is charged for what they keep others from, not just for their cores."""

    cpus_per_mb: float
    cpus_per_gpu: float

    @classmethod
    def of_pool(cls, total: Resources) -> "Pricing":
        """Prices from the pool's total capacity (no memory or no GPU: that resource is free,
        and nothing can ask for it anyway)."""
        cpus = total.millicpus / 1000
        return cls(
            cpus / total.memory_mb if total.memory_mb else 0.0,
            cpus / total.gpus if total.gpus else 0.0,
        )

    def cost(self, amount: Resources) -> float:
        """`amount`'s cost in CPUs: its dominant resource, priced."""
        return max(
            amount.millicpus / 1000,
            amount.memory_mb * self.cpus_per_mb,
            amount.gpus * self.cpus_per_gpu,
        )
