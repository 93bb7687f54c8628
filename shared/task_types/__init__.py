"""Task types: the code behind the three stages of a task (design §2, §3).

A task type is a `TaskType` subclass registered under the `vigil.task_types` entry-point group.
Its methods are plain (synchronous) Python; the worker runs them in a thread.
"""

from shared.task_types.base import TaskContext, TaskType
from shared.task_types.registry import load_task_types

__all__ = ["TaskContext", "TaskType", "load_task_types"]
