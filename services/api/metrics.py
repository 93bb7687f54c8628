"""Prometheus metrics of the api, in a registry of the app's own (no global registry)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from services.api import queries
from shared.db import Connection
from shared.states import JobState, TaskState


class Metrics:
    """Counters updated by the routes, and gauges of jobs and tasks per state set at scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.jobs_submitted = Counter(
            "vigil_api_jobs_submitted",
            "Jobs created through this api process",
            registry=self.registry,
        )
        self.jobs = Gauge(
            "vigil_jobs",
            "Jobs per state, counted at scrape time",
            ["state"],
            registry=self.registry,
        )
        self.tasks = Gauge(
            "vigil_tasks",
            "Tasks per state, counted at scrape time",
            ["state"],
            registry=self.registry,
        )

    async def scrape(self, conn: Connection) -> bytes:
        """Refresh the per-state gauges from the database and render the text exposition."""
        jobs = await queries.jobs_per_state(conn)
        tasks = await queries.tasks_per_state(conn)
        for job_state in JobState:
            self.jobs.labels(job_state.value).set(jobs.get(job_state.value, 0))
        for task_state in TaskState:
            self.tasks.labels(task_state.value).set(tasks.get(task_state.value, 0))
        return generate_latest(self.registry)
