"""The `diagnostics` task type: sleeps in each stage and fails where it is told to.

The tool for testing the lifecycle: `params` = `setup_delay`, `cluster_delay`, `post_delay`
(seconds) and `fail_in` (`setup`, `cluster` or `post_processing`; `fail_how` = `false` or
`raise` for the Python stages). Its recover and restart hooks succeed (unless `refuse_hooks`),
and a recovered stage does not fail again when `fail_once` is set (a marker file in the work
dir remembers the recovery).
"""

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.task_types.base import TaskContext, TaskType

Stage = Literal["setup", "cluster", "post_processing"]


class DiagnosticsParams(BaseModel):
    """The `params` a diagnostics job accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    setup_delay: float = Field(default=0, ge=0, le=3600)
    cluster_delay: float = Field(default=0, ge=0, le=86400)
    post_delay: float = Field(default=0, ge=0, le=3600)
    fail_in: Stage | None = None
    fail_how: Literal["false", "raise"] = "false"
    fail_once: bool = False
    #: The recover/restart hooks answer False (the task must keep its state).
    refuse_hooks: bool = False


class DiagnosticsTaskType(TaskType):
    """Delays and injected failures, per stage."""

    name = "diagnostics"
    params_model = DiagnosticsParams

    def _params(self, ctx: TaskContext) -> DiagnosticsParams:
        return DiagnosticsParams.model_validate(ctx.params)

    def _fails(self, ctx: TaskContext, stage: Stage) -> bool:
        params = self._params(ctx)
        if params.fail_in != stage:
            return False
        return not (params.fail_once and (ctx.workdir / f".recovered-{stage}").exists())

    def _python_stage(self, ctx: TaskContext, stage: Stage, delay: float) -> bool:
        time.sleep(delay)
        if self._fails(ctx, stage):
            if self._params(ctx).fail_how == "raise":
                raise RuntimeError(f"diagnostics told to fail in {stage}")
            return False
        return True

    def setup(self, ctx: TaskContext) -> bool:
        ctx.safe_mkdir(".vigil")
        return self._python_stage(ctx, "setup", self._params(ctx).setup_delay)

    def cluster_commands(self, ctx: TaskContext) -> str:
        delay = self._params(ctx).cluster_delay
        fail = "exit 1" if self._fails(ctx, "cluster") else "exit 0"
        return f'echo "diagnostics: cluster stage for {delay}s"; sleep {delay}; {fail}'

    def save_results(self, ctx: TaskContext) -> bool:
        if ctx.exit_code != 0:
            return False
        return self._python_stage(ctx, "post_processing", self._params(ctx).post_delay)

    def _mark_recovered(self, ctx: TaskContext, stage: Stage) -> bool:
        if self._params(ctx).refuse_hooks:
            return False
        ctx.safe_mkdir(".")
        (ctx.workdir / f".recovered-{stage}").touch()
        return True

    def recover_from_setup_failure(self, ctx: TaskContext) -> bool:
        return self._mark_recovered(ctx, "setup")

    def recover_from_cluster_failure(self, ctx: TaskContext) -> bool:
        return self._mark_recovered(ctx, "cluster")

    def recover_from_post_processing_failure(self, ctx: TaskContext) -> bool:
        return self._mark_recovered(ctx, "post_processing")

    def restart_at_setup(self, ctx: TaskContext) -> bool:
        return not self._params(ctx).refuse_hooks

    def restart_at_cluster(self, ctx: TaskContext) -> bool:
        return not self._params(ctx).refuse_hooks

    def restart_at_post_processing(self, ctx: TaskContext) -> bool:
        return not self._params(ctx).refuse_hooks
