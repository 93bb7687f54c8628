"""An application's own resubmission rule, built on `vigil.Client` events (docs/reference/cli.md).

Vigil resubmits infra failures itself only for `restartable` jobs. This rule goes further for
the jobs it watches: a task killed by a signal (OOM killer, SIGSEGV) is duplicated, at most
twice per original task. Run it with VIGIL_URL and VIGIL_TOKEN set (an operator's token: a
user follows their own jobs by id, `task.failed_on_cluster.<job id>`).
"""

import logging
from collections import Counter

from vigil import Client, Conflict, Event

logger = logging.getLogger("resubmit_on_signal")


def install(client: Client, limit: int = 2) -> None:
    """Register the rule on `client`; it acts while `client.listen()` runs."""
    tries: Counter[str] = Counter()  # duplicates made, per original task
    origin: dict[str, str] = {}  # duplicate -> the original task it stands for

    @client.on("task.failed_on_cluster.*")
    def resubmit_killed(event: Event) -> None:
        task_id = event.body["task_id"]
        first = origin.get(task_id, task_id)
        if event.body["failure_class"] != "signal" or tries[first] >= limit:
            return
        try:
            created = client.task_action(task_id, "duplicate")["created"]
        except Conflict as exc:  # e.g. the job was cancelled meanwhile
            logger.warning("not duplicated: %s", exc.message)
            return
        tries[first] += 1
        origin[created["id"]] = first
        logger.info("%s killed by a signal: duplicated as %s", task_id, created["id"])


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    with Client.from_env() as vigil:
        install(vigil)
        vigil.listen()  # reconnects by itself; Ctrl-C to stop
