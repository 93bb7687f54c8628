"""`vigil`: the command-line client. Every command goes through `vigil.client.Client`.

Ids say what they name: `j-...` is a job, `t-...` a task. Exit codes: see `vigil.session`.
One module per group of commands; importing them registers their commands on `app`, in the
order `vigil --help` lists them.
"""

# In the order `vigil --help` lists their commands.
from vigil.cli import jobs  # isort: skip
from vigil.cli import tasks  # isort: skip
from vigil.cli import why  # isort: skip
from vigil.cli import actions  # isort: skip
from vigil.cli import results  # isort: skip
from vigil.cli import operators  # isort: skip
from vigil.cli import accounts  # isort: skip
from vigil.cli import fixes  # isort: skip
from vigil.cli.actions import RestartStage
from vigil.cli.base import app
from vigil.cli.jobs import JobState, Severity

__all__ = [
    "JobState",
    "RestartStage",
    "Severity",
    "accounts",
    "actions",
    "app",
    "fixes",
    "jobs",
    "operators",
    "results",
    "tasks",
    "why",
]
