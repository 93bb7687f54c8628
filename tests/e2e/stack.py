"""The four services as real processes, on a database and namespace of their own: the
benchmarks' `Cluster` with one host, and detection scaled down for tests."""

from typing import Final

from bench.cluster import Cluster

#: A stack is a one-host cluster: `worker` and `supervisor` name that host's processes.
Stack = Cluster

#: Settings of every end-to-end stack (on top of the cluster's own).
E2E_ENV: Final = {
    "VIGIL_WORKER_SLOTS": "4",
    # Jobs run as a user gets them from the README: confined (the services run as root here),
    # as their owner's uid, with the default limits. A test shares files with its jobs through
    # `shared_dir` (tests/e2e/conftest.py), never its private tmp dir.
    "VIGIL_LOG_LEVEL": "DEBUG",
    "VIGIL_GRACEFUL_TIMEOUT_S": "5",
    # detection scaled down for tests: a silent worker or host is judged in 3 s
    "VIGIL_VITALS_S": "0.2",
    "VIGIL_KILL_GRACE_S": "1",
    "VIGIL_DEAD_WORKER_S": "3",
    "VIGIL_DEAD_HOST_S": "3",
    "VIGIL_FENCE_TIMEOUT_S": "60",
    "VIGIL_QUARANTINE_AFTER": "0",
    # retention tested in seconds: a job may keep its data 1 s, pruning looks every second
    "VIGIL_MIN_RETENTION_S": "1",
    "VIGIL_PRUNE_EVERY_S": "1",
}
