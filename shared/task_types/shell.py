"""The default task type: the job's command run by bash over each input."""

import json
import os

from shared.host import job_files
from shared.task_types.base import TaskContext, TaskType


def not_written(missing: list[str]) -> str:
    """What a task whose command did not write its declared outputs `missing` failed of."""
    if len(missing) == 1:
        return f"output {missing[0]} was not written"
    return f"outputs {', '.join(missing)} were not written"


class ShellTaskType(TaskType):
    """setup writes the input; the command is the job's script; save_results checks outputs."""

    name = "shell"
    #: Writing the input (and linking upstream outputs), and returning the command.
    inline_hooks = frozenset({"setup", "cluster_commands"})

    def setup(self, ctx: TaskContext) -> bool:
        ctx.safe_mkdir(".vigil")
        value = ctx.input if isinstance(ctx.input, str) else json.dumps(ctx.input)
        job_files.write_file(ctx.workdir, ".vigil/input", value.encode())
        # A chained input, resolved by the worker: its upstream outputs, read-only.
        ctx.place_upstream_outputs()
        return True

    def cluster_commands(self, ctx: TaskContext) -> str:
        return ctx.command

    def save_results(self, ctx: TaskContext) -> bool:
        if ctx.exit_code != 0:
            return False
        if ctx.status is not None and ctx.status.status != "success":
            return False
        missing = [name for name in ctx.outputs if not os.path.lexists(ctx.workdir / name)]
        if missing:
            ctx.why_failed = not_written(missing)
            return False
        for name in ctx.outputs:
            ctx.record_output(name)  # a link, FIFO or device there raises UnsafeFile
        return True

    def results_are_saved(self, ctx: TaskContext) -> bool:
        # save_results above with no outputs to record: a success, and nothing to do
        return (
            ctx.exit_code == 0
            and not ctx.outputs
            and (ctx.status is None or ctx.status.status == "success")
        )

    # Every stage of `shell` can be run again in the same work dir (setup is idempotent and the
    # command is the user's to make restartable), so recovery and restart just say yes.

    def recover_from_setup_failure(self, ctx: TaskContext) -> bool:
        return True

    def recover_from_cluster_failure(self, ctx: TaskContext) -> bool:
        return True

    def recover_from_post_processing_failure(self, ctx: TaskContext) -> bool:
        return True

    def restart_at_setup(self, ctx: TaskContext) -> bool:
        return True

    def restart_at_cluster(self, ctx: TaskContext) -> bool:
        return True

    def restart_at_post_processing(self, ctx: TaskContext) -> bool:
        return True
