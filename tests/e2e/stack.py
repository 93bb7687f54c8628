"""The four services as real processes, on a database and namespace of their own: the
benchmarks' `Cluster` with one host, and detection scaled down for tests.

Each setting below that departs from what a user gets says why in one line. Jobs run as a
user gets them from the README: confined (the services run as root here), as their owner's
uid, with the default limits. A test shares files with its jobs through `shared_dir`
(tests/e2e/conftest.py), never its private tmp dir."""

from typing import Final

from bench.cluster import Cluster

#: A stack is a one-host cluster: `worker` and `supervisor` name that host's processes.
Stack = Cluster

#: Settings of the stack at the defaults (`defaults` marker): the worker detects its CPUs, the
#: host breaker is on, the api keeps its limits; only what tests wait for is scaled down.
DEFAULTS_ENV: Final = {
    "VIGIL_LOG_LEVEL": "DEBUG",  # a failed test prints the services' logs: all of them
    # detection scaled down for tests: a silent worker or host is judged in 3 s, not 10
    "VIGIL_VITALS_S": "0.2",
    "VIGIL_KILL_GRACE_S": "1",
    "VIGIL_DEAD_WORKER_S": "3",
    "VIGIL_DEAD_HOST_S": "3",
    "VIGIL_GRACEFUL_TIMEOUT_S": "5",  # a stopped service waits 5 s for its work, not 10
}

#: Settings of every other end-to-end stack (on top of the cluster's own).
E2E_ENV: Final = {
    **DEFAULTS_ENV,
    "VIGIL_WORKER_SLOTS": "4",  # 4 tasks at once on a 2-core machine: tests count on 4
    "VIGIL_QUARANTINE_AFTER": "0",  # tests that fail tasks on purpose would shut the host
    # retention tested in seconds: a job may keep its data 1 s, pruning looks every second
    "VIGIL_MIN_RETENTION_S": "1",
    "VIGIL_PRUNE_EVERY_S": "1",
}
