"""A task's result files, as its post-processing records them (design §6)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class OutputRecord:
    """One result file of a task: where it is and what it holds."""

    name: str
    path: str
    size: int
    sha256: str
    #: The file's bytes when it was small enough to keep for download, else None.
    content: bytes | None = None
    #: Why the bytes were not kept (e.g. "over the 1 MiB download limit").
    not_kept: str | None = None
    #: Its key in the object store, once stage-out put it there (`services/worker/stage_out.py`).
    object_key: str | None = None


@dataclass(frozen=True)
class UpstreamOutput:
    """One recorded output of an upstream task, as a chained task of the same owner gets it:
    the record, and the kept bytes when the file is not on the chained task's host."""

    task_id: str
    name: str
    path: str
    host: str | None
    size: int
    sha256: str
    #: The bytes kept in the database, fetched only when the file is not on this host.
    content: bytes | None = None
    #: Why the bytes were not kept, if they were not.
    not_kept: str | None = None
    #: Its key in the object store when the file is not on the chained task's host: the
    #: worker stages it in from there (`services/worker/stage_in.py`) before the setup.
    object_key: str | None = None
