"""A pilot: one host of Vigil inside a batch system's allocation, for its walltime.

`python -m services.pilot` runs as the batch job's command: it reads the allocation from the
batch system's environment (`allocation.py`), marks its host's end (`hosts.ends_at`: the
scheduler places on it only tasks whose walltime fits), then runs this host's worker and
supervisor, the very services an operator runs elsewhere, as its children. It drains before
the walltime (no new task; those running are stopped and, being infra's loss, resubmitted
elsewhere) and stops its children, and so its tasks, when the batch system stops it
(`scancel`, the walltime's SIGTERM): processes that leave the job's tree would outlive it
otherwise. A pilot that dies is a host lost: its heartbeats stop and the scheduler's
reaper declares its tasks lost (`docs/how-to/pilots.md`).
"""
