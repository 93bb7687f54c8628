"""Finding task types through the `vigil.task_types` entry points."""

from importlib.metadata import entry_points
from typing import Final

from shared.task_types.base import TaskType

GROUP: Final = "vigil.task_types"


def available_names() -> list[str]:
    """The names of every registered task type, sorted (does not import them)."""
    return sorted(ep.name for ep in entry_points(group=GROUP))


def load_task_types() -> dict[str, TaskType]:
    """One instance of every registered task type, by name."""
    found: dict[str, TaskType] = {}
    for ep in entry_points(group=GROUP):
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, TaskType)):
            raise TypeError(f"entry point {ep.name} is not a TaskType subclass: {cls!r}")
        found[ep.name] = cls()
    return found
