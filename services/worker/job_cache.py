"""The jobs a worker has read, by their row version: a take of a task of a known job reads
nothing.

A work message from the planning round carries its task's row as the claim left it and its
job's row version then (`jobs.xmin`, which every update of the row changes: a state, an edit,
a probe). A worker that read that job at that version already has what a take would read:
its take (`Taker.read`) then reads nothing, and a big job's tasks cost PostgreSQL one
statement fewer each. A job at another version (changed since, or a message older than what
was read) is read again, as is a job the cache no longer holds.
"""

from collections import OrderedDict
from typing import Final

from shared.store.jobs_repo import Job

#: Jobs kept at most (the least recently used go first): a host runs the tasks of a few
#: jobs at a time.
MOST_JOBS: Final = 256


class JobCache:
    """Jobs by id, each at the row version it was read at."""

    def __init__(self, most: int = MOST_JOBS) -> None:
        self._most = most
        self._jobs: OrderedDict[str, tuple[int, Job]] = OrderedDict()
        #: Jobs found at their version, for benchmarks and tests.
        self.hits = 0

    def get(self, job_id: str, version: int) -> Job | None:
        """The job as read at `version`, or None (not read, or read at another version)."""
        kept = self._jobs.get(job_id)
        if kept is None or kept[0] != version:
            return None
        self._jobs.move_to_end(job_id)
        self.hits += 1
        return kept[1]

    def keep(self, job: Job, version: int) -> None:
        """Remember `job` as read at `version`."""
        self._jobs[job.id] = (version, job)
        self._jobs.move_to_end(job.id)
        while len(self._jobs) > self._most:
            self._jobs.popitem(last=False)
