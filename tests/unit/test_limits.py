"""A task's limits: the job's `policy.limits` where it gives them, else the worker's, and the
cgroup files that set them."""

import uuid
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from services.worker.limits import HOST_SHARE, default_memory_mb, resolve
from shared.domain.outcomes import limit_outcome
from shared.domain.policy import Limits, Policy
from shared.domain.scheduling.resources import Resources
from shared.domain.states import FailureClass, TaskState
from shared.host.cgroups import Cgroups, TaskLimits, _v1_mounts


def test_what_the_request_does_not_name_is_the_jobs_limit_else_the_workers_and_zero_is_none() -> (
    None
):
    asked = Limits(memory_mb=64, cpus=None, pids=None)
    one_cpu = Resources.of(1)  # no memory asked

    limits = resolve(asked, one_cpu, memory_mb=1024, cpus=0.0, pids=4096)

    assert limits == TaskLimits(memory_bytes=64 * 2**20, cpus=1.0, pids=4096)
    assert resolve(Limits(), one_cpu, 1024, 0.0, 0) == TaskLimits(1024 * 2**20, 1.0, None)
    assert resolve(Limits(), one_cpu, 0, 0.0, 0) == TaskLimits(cpus=1.0)


def test_the_request_sets_cpus_and_memory_and_the_jobs_limits_may_only_narrow_them() -> None:
    request = Resources.of(0.5, memory_mb=256)

    alone = resolve(Limits(), request, memory_mb=1024, cpus=2.0, pids=4096)
    wider = resolve(Limits(memory_mb=512, cpus=2, pids=16), request, 1024, 2.0, 4096)
    narrower = resolve(Limits(memory_mb=64, cpus=0.25), request, 1024, 2.0, 4096)

    assert alone == TaskLimits(memory_bytes=256 * 2**20, cpus=0.5, pids=4096)
    assert wider == TaskLimits(memory_bytes=256 * 2**20, cpus=0.5, pids=16)
    assert narrower == TaskLimits(memory_bytes=64 * 2**20, cpus=0.25, pids=4096)
    # quota = millicpus * period / 1000
    assert alone.v2_files()["cpu.max"] == "50000 100000"
    assert resolve(Limits(), Resources(1500), 0, 0.0, 0).v1_files("cpu") == {
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "150000",
    }


def test_v2_and_v1_files_set_memory_with_its_swap_cpu_quota_and_pids() -> None:
    limits = TaskLimits(memory_bytes=2**20, cpus=1.5, pids=64)

    assert limits.v2_files() == {
        "memory.max": "1048576",
        "memory.swap.max": "0",
        "pids.max": "64",
        "cpu.max": "150000 100000",
    }
    # memory first: memsw may never be below it
    assert list(limits.v1_files("memory").items()) == [
        ("memory.limit_in_bytes", "1048576"),
        ("memory.memsw.limit_in_bytes", "1048576"),
    ]
    assert limits.v1_files("cpu") == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "150000"}
    assert limits.v1_files("pids") == {"pids.max": "64"}
    assert TaskLimits().v1_files("memory") == {} and TaskLimits().v2_files() == {}


def test_v1_hierarchies_are_found_by_controller_even_when_mounted_together() -> None:
    mounts = (
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    )

    found = _v1_mounts(mounts)

    assert {k: str(v) for k, v in found.items()} == {
        "cpu": "/sys/fs/cgroup/cpu,cpuacct",
        "memory": "/sys/fs/cgroup/memory",
    }


@pytest.mark.parametrize(
    "limits", [{"memory_mb": 1}, {"cpus": 0}, {"pids": 2}, {"disk_mb": 10}, {"memory_mb": "lots"}]
)
def test_a_policy_refuses_limits_that_make_no_sense(limits: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Policy.model_validate({"limits": limits})


def test_going_over_the_memory_limit_is_the_jobs_failure_and_says_which_limit() -> None:
    killed = limit_outcome(-9, 64 * 2**20)
    child_killed = limit_outcome(137, None)

    assert killed.state is TaskState.FAILED_ON_CLUSTER
    assert killed.failure_class is FailureClass.LIMIT and killed.signal == 9
    assert killed.brief == (
        "killed by the kernel: over the task's memory limit of 64 MiB (policy.limits.memory_mb):"
        " the OOM killer ended its command"
    )
    assert child_killed.exit_code == 137 and child_killed.signal is None
    assert child_killed.brief is not None
    assert child_killed.brief.endswith("the OOM killer ended one of its processes")
    assert not killed.crashed


def test_unset_the_memory_limit_is_most_of_the_hosts_and_zero_is_none() -> None:
    total_mb = psutil.virtual_memory().total / 2**20

    share = default_memory_mb(None)

    assert 0 < share <= total_mb * HOST_SHARE < share + 1
    assert default_memory_mb(0) == 0 and default_memory_mb(512) == 512


def test_a_kill_is_the_tasks_own_only_if_its_cgroup_reached_its_limit(tmp_path: Path) -> None:
    """The host-wide OOM killer counts its kills in the victim's cgroup too (v1 files here)."""
    claim = uuid.uuid4()
    groups = Cgroups(tmp_path / "v2", v1_roots=(("memory", tmp_path / "memory"),))
    [where] = groups.limiter_paths("t-1", claim)
    where.mkdir(parents=True)
    (where / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (where / "memory.limit_in_bytes").write_text("67108864\n")

    (where / "memory.max_usage_in_bytes").write_text("50000000\n")
    host_wide = groups.over_memory("t-1", claim)
    (where / "memory.max_usage_in_bytes").write_text("67108864\n")
    its_own = groups.over_memory("t-1", claim)

    assert (host_wide, its_own) == (False, True)
