"""The default task type: the job's command run by bash over each input."""

import glob
import json
import os
import stat
from pathlib import Path

from shared.host import job_files
from shared.task_types.base import TaskContext, TaskType


def not_written(missing: list[str]) -> str:
    """What a task whose command did not write its declared outputs `missing` failed of."""
    if len(missing) == 1:
        return f"output {missing[0]} was not written"
    return f"outputs {', '.join(missing)} were not written"


_GLOB_CHARS = frozenset("*?[")


def matching(workdir: Path, declared: str) -> list[str]:
    """The work dir's files that a declared output names: itself when it exists (whatever its
    characters), else, for a pattern (`*`, `?`, `[...]`), every regular file of the work dir's
    own level whose name it matches, but those starting with a dot (`.vigil`; a link or a
    directory is no output): none when nothing matches."""
    if os.path.lexists(workdir / declared):
        return [declared]
    if not _GLOB_CHARS & set(declared):
        return []
    names = glob.glob(declared, root_dir=workdir)
    return sorted(n for n in names if stat.S_ISREG(os.lstat(workdir / n).st_mode))


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
        found = {declared: matching(ctx.workdir, declared) for declared in ctx.outputs}
        missing = [declared for declared, names in found.items() if not names]
        if missing:
            ctx.why_failed = not_written(missing)
            return False
        for name in sorted({name for names in found.values() for name in names}):
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
