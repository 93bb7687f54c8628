"""`TaskType`, the contract a task type implements, and `TaskContext`, what its hooks receive."""

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from pydantic import BaseModel

from shared.domain.outputs import OutputRecord as OutputRecord  # task types import it from here
from shared.domain.outputs import UpstreamOutput
from shared.domain.sizes import human_size
from shared.domain.states import TaskState
from shared.domain.status_report import StatusReport
from shared.host import chained_inputs, job_files


@dataclass
class TaskContext:
    """Everything a hook may need about one task; the helpers are idempotent.

    `exit_code` and `status` are filled in after the command ran (for `save_results`).
    """

    job_id: str
    task_id: str
    index: int
    input: Any
    workdir: Path
    attempt: int
    run_number: int
    command: str
    #: Which start of the input's cluster stage this is, 1 for the first: a recovery in place
    #: and a resubmitted clone count on (`$VIGIL_TRY`).
    try_number: int = 1
    outputs: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    resume: dict[str, Any] | None = None
    exit_code: int | None = None
    status: StatusReport | None = None
    #: Outputs recorded by `record_output` (persisted by the worker when the stage succeeds).
    recorded: dict[str, OutputRecord] = field(default_factory=dict)
    #: `record_output` keeps the bytes of files up to this size for download (worker setting),
    #: as long as the kept bytes of the task's outputs stay within `keep_total_bytes`.
    keep_bytes: int = 0
    keep_total_bytes: int = 0
    #: A chained task's upstream outputs by name (`place_upstream_outputs` puts them in).
    upstream: dict[str, UpstreamOutput] = field(default_factory=dict)
    #: What a hook that returns False says of why (as `output out.dat was not written`): the
    #: task's `error_brief`. Without it the brief says only which hook refused.
    why_failed: str | None = None

    @property
    def status_name(self) -> str:
        """`status_file`, inside the work dir."""
        return f".vigil/status.run{self.run_number}.json"

    @property
    def status_file(self) -> Path:
        """Where the command may write its own diagnosis (`$VIGIL_STATUS_FILE`)."""
        return self.workdir / self.status_name

    def run_file(self, stream: str) -> Path:
        """The stdout or stderr file of the current run, kept per run."""
        return self.workdir / ".vigil" / f"run{self.run_number}.{stream}"

    def environment(self) -> dict[str, str]:
        """The `VIGIL_*` variables the command sees (design §3)."""
        value = self.input if isinstance(self.input, str) else json.dumps(self.input)
        return {
            "VIGIL_JOB_ID": self.job_id,
            "VIGIL_TASK_ID": self.task_id,
            "VIGIL_TASK_INDEX": str(self.index),
            "VIGIL_INPUT": value,
            "VIGIL_RUN_NUMBER": str(self.run_number),
            "VIGIL_ATTEMPT": str(self.attempt),
            "VIGIL_TRY": str(self.try_number),
            "VIGIL_WORKDIR": str(self.workdir),
            "VIGIL_STATUS_FILE": str(self.status_file),
            "VIGIL_RESUME": json.dumps(self.resume) if self.resume is not None else "",
        }

    def safe_mkdir(self, path: Path | str) -> Path:
        """Create a directory (and parents) under the work dir; nothing happens if it exists."""
        self.workdir.mkdir(parents=True, exist_ok=True)  # the dirs above it are the worker's
        job_files.make_dirs(self.workdir, path)  # through no link the job may have left
        return self.workdir / path

    def record_output(self, name: str) -> OutputRecord:
        """Find or create the output record of file `name` of the work dir (size, sha256, and
        its bytes when it is small: see `keep_bytes`).

        Idempotent: recording the same file again replaces its record for this run. Raises
        `UnsafeFile` for a name that is not a regular file of the work dir itself (a link, a
        FIFO, a device): the job made it, and it is never followed.
        """
        path = self.workdir / name
        digest = hashlib.sha256()
        kept: list[bytes] | None = []
        size = 0
        limit = self._keep_limit(name)
        with job_files.open_regular(self.workdir, name) as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
                if kept is not None and size > limit:
                    kept = None  # too large to keep: hash the rest only
                if kept is not None:
                    kept.append(chunk)
            chained_inputs.freeze(handle.fileno())  # recorded: no job may change it now
        content = b"".join(kept) if kept is not None else None
        record = OutputRecord(
            name,
            str(path),
            size,
            digest.hexdigest(),
            content,
            None if content is not None else self._why_not_kept(size),
        )
        self.recorded[name] = record
        return record

    def _keep_limit(self, name: str) -> int:
        """The most bytes of output `name` that may be kept: the per-file limit, or what is
        left of the task's budget."""
        used = sum(len(r.content or b"") for n, r in self.recorded.items() if n != name)
        return min(self.keep_bytes, self.keep_total_bytes - used)

    def _why_not_kept(self, size: int) -> str:
        if size > self.keep_bytes:
            return f"over the {human_size(self.keep_bytes)} download limit"
        return (
            f"over what was left of the {human_size(self.keep_total_bytes)} the task's"
            " outputs may keep for download"
        )

    def place_upstream_outputs(self) -> None:
        """Put a chained task's upstream outputs in its work dir, each by its name, read-only
        (`shared/host/chained_inputs.py`: a hard link, a copy, or the bytes kept in the
        database). `InputUnavailable` when one cannot be had, saying why."""
        work_root = self.workdir.parent.parent  # <work root>/<job>/<task>
        for name, output in self.upstream.items():
            chained_inputs.place(work_root, self.workdir, name, output)

    def safe_symlink(self, source: Path | str, name: Path | str) -> Path:
        """Point `name` (a plain file name of the work dir) at `source` (a file under the
        hosts' work root: another task's output), replacing only a link that points elsewhere.
        `UnsafeFile` for a name with a `/`, `.`, `..` or the `.vigil` dir, or a source outside
        the work root."""
        name = str(name)
        job_files.check_plain_name(name, "a linked input")
        root = self.workdir.parent.parent  # <work root>/<job>/<task>
        if not os.path.normpath(source).startswith(f"{root}{os.sep}"):
            raise job_files.UnsafeFile(f"{str(source)!r} is not a file of a task's work dir")
        link = self.workdir / name
        if link.is_symlink() and os.readlink(link) == str(source):
            return link
        if link.is_symlink():
            link.unlink()
        link.symlink_to(source)
        return link


#: The hook a worker runs for each action state (design §2 recovery and restart tables).
HOOK_FOR_ACTION: Final[dict[TaskState, str]] = {
    TaskState.RECOVER_SETUP: "recover_from_setup_failure",
    TaskState.RECOVER_CLUSTER: "recover_from_cluster_failure",
    TaskState.RECOVER_POST_PROCESSING: "recover_from_post_processing_failure",
    TaskState.RESTART_SETUP: "restart_at_setup",
    TaskState.RESTART_CLUSTER: "restart_at_cluster",
    TaskState.RESTART_POST_PROCESSING: "restart_at_post_processing",
}


class TaskType:
    """The three stages and six recover/restart hooks. Defaults: no recovery, no restart.

    A hook returns True for success; returning False or raising keeps (or sends) the task in
    the matching failed state, with the attempt recorded. Hooks should be idempotent: a stage
    may run again after a crash, and a recovery hook may follow a half-done stage.
    """

    #: The name users put in `type`; also the entry-point name.
    name: ClassVar[str] = ""
    #: The model `params` must fit (checked at submission: a bad field is a 422), if any.
    params_model: ClassVar[type[BaseModel] | None] = None
    #: Hooks the worker may call on its event loop rather than in a thread: only those that
    #: do a few small file operations in the task's work dir and never wait (a thread hop
    #: costs more than they do). Every other hook runs in a thread.
    inline_hooks: ClassVar[frozenset[str]] = frozenset()

    def setup(self, ctx: TaskContext) -> bool:
        """Prepare the work dir. Runs on a worker in `setting_up`."""
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        return True

    def cluster_commands(self, ctx: TaskContext) -> str:
        """The bash script to run in the work dir (in `on_cpu`)."""
        raise NotImplementedError

    def save_results(self, ctx: TaskContext) -> bool:
        """Check and record the results (in `post_processing`). Default: the command exited 0."""
        return ctx.exit_code == 0

    def results_are_saved(self, ctx: TaskContext) -> bool:
        """Whether `save_results(ctx)` would record nothing and return True, so that running it
        can be skipped (`ctx` as `save_results` would get it: exit code and status file set).
        Then the worker ends the task at its command's exit, in one move that still passes
        through `data_ready` and `post_processing` (their events and a post-processing attempt
        are written). Default: False, `save_results` always runs in its own stage."""
        return False

    def recover_from_setup_failure(self, ctx: TaskContext) -> bool:
        return False

    def recover_from_cluster_failure(self, ctx: TaskContext) -> bool:
        return False

    def recover_from_post_processing_failure(self, ctx: TaskContext) -> bool:
        return False

    def restart_at_setup(self, ctx: TaskContext) -> bool:
        return False

    def restart_at_cluster(self, ctx: TaskContext) -> bool:
        return False

    def restart_at_post_processing(self, ctx: TaskContext) -> bool:
        return False
