"""Every Redis key Vigil uses, prefixed by the namespace. Redis holds only ephemeral state."""

from dataclasses import dataclass
from typing import Final

from shared.domain.ids import is_safe_id

#: A worker's registration expires this long after its last heartbeat.
WORKER_TTL_S: Final = 10
#: Progress and live state of a job are dropped this long after the last write.
JOB_TTL_S: Final = 7 * 24 * 3600


@dataclass(frozen=True)
class RedisKeys:
    """Key builder for one installation."""

    namespace: str = ""

    def _key(self, *parts: str) -> str:
        for part in parts:
            if not is_safe_id(part):
                raise ValueError(f"unsafe key part {part!r}")
        prefix = (self.namespace + ":") if self.namespace else ""
        return prefix + "vigil:" + ":".join(parts)

    def worker(self, host_id: str) -> str:
        """Hash of the worker process on `host_id`: pid, create_time, instance, slots."""
        return self._key("host", host_id, "worker")

    def handovers(self, host_id: str) -> str:
        """List of the commands `host_id`'s worker handed to its supervisor, not yet taken
        (`shared/host/handovers.py`)."""
        return self._key("host", host_id, "handovers")

    def relay_nudges(self) -> str:
        """Pub/sub channel on which workers nudge the leading scheduler's relay
        (`shared/messaging/relay_nudges.py`)."""
        return self._key("relay", "nudges")

    def beats(self) -> str:
        """List of the hosts' workers' and supervisors' heartbeats not yet taken by the
        leading scheduler, which writes them into PostgreSQL (`shared/messaging/beat_board.py`)."""
        return self._key("beats")

    def beat_answers(self) -> str:
        """Hash of `<kind>:<host>` -> the scheduler's answer to that service's beats: the last
        one it wrote into PostgreSQL, and what PostgreSQL said of the host then."""
        return self._key("beats", "answers")

    def job_exits(self, job_id: str) -> str:
        """Hash of task id -> `<claim> <exit status>`, written by the worker the moment a
        command of the job exits.

        It tells the supervisor that the worker saw the exit and will report it, so a report
        slowed down by log flushing is not mistaken for a process that vanished.
        """
        return self._key("job", job_id, "exits")

    def job_progress(self, job_id: str) -> str:
        """Hash of task id -> last reported progress (0-100) for `job_id`."""
        return self._key("job", job_id, "progress")

    def submit_bucket(self, token_id: str) -> str:
        """Token bucket (hash of `tokens`, `ts`) limiting the submissions of one api token.

        `token_id` is a prefix of the token's sha256, never the token itself.
        """
        return self._key("api", "submit", token_id)

    def task_bucket(self, user_id: str) -> str:
        """Token bucket (hash of `tokens`, `ts`) limiting the tasks one user creates."""
        return self._key("api", "tasks", user_id)

    def job_keys(self, job_id: str) -> list[str]:
        """Every key that belongs to `job_id`, for the purge at the end of the job.

        Named, not matched: a SCAN for a pattern walks the whole keyspace, once per job.
        """
        return [self.job_progress(job_id), self.job_exits(job_id)]
