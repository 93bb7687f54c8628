"""Pilot settings (`VIGIL_*` environment variables; its worker and supervisor read theirs)."""

from pydantic import Field

from shared.runtime.config import ENV_PREFIX, CommonSettings, VigilSettings


class PilotMargins(VigilSettings):
    """How a pilot ends before its allocation does (the pilot; the scheduler passes those set
    in its own environment on to the pilots it submits)."""

    #: This long before the end, the host takes no new task (`VIGIL_PILOT_DRAIN_S`).
    pilot_drain_s: float = Field(default=120.0, ge=0)
    #: This long before the end, the pilot stops its worker and supervisor, and so the
    #: commands still running (lost: infra's, resubmitted elsewhere), before the batch
    #: system kills them (`VIGIL_PILOT_STOP_S`).
    pilot_stop_s: float = Field(default=30.0, ge=0)

    def margins_set(self) -> dict[str, str]:
        """The margins set in this environment, as variables to pass on to a pilot."""
        return {
            f"{ENV_PREFIX}{name.upper()}": str(getattr(self, name))
            for name in ("pilot_drain_s", "pilot_stop_s")
            if name in self.model_fields_set
        }


class PilotSettings(CommonSettings, PilotMargins):
    """How long the allocation lasts and how the pilot ends before it does."""

    #: The walltime the pilot was submitted with (`sbatch --time`; `VIGIL_PILOT_WALLTIME_S`).
    pilot_walltime_s: float = Field(default=3600.0, gt=0)
    #: Host ids are `<prefix>-<batch job id>` (`VIGIL_PILOT_HOST_PREFIX`).
    pilot_host_prefix: str = Field(default="pilot", pattern=r"^[a-z0-9][a-z0-9-]{0,30}$")
