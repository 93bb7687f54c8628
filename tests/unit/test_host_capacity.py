"""A host's capacity: what its worker advertises and admits tasks by, from its
settings, else found in made-up `/proc` and cgroup files (no real host's)."""

from pathlib import Path

import pytest

from services.worker.settings import WorkerSettings
from shared.domain.scheduling.resources import Resources
from shared.host import capacity
from shared.host.capacity import HostCapacity

MOUNTS = (
    "proc /proc proc rw,nosuid 0 0\n"
    "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
)
SELF_CGROUP = "0::/system.slice/vigil-worker.service/worker\n"
MEMINFO = "MemTotal:       16303480 kB\nMemFree:         1236984 kB\n"
NVIDIA_SMI = (
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5e8d3a2c-0000-0000-0000-000000000000)\n"
    "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5e8d3a2c-0000-0000-0000-000000000001)\n"
)
UNIT = Path("/sys/fs/cgroup/system.slice/vigil-worker.service")


def _files(files: dict[Path, str]) -> capacity.Reader:
    return files.get


def test_the_own_cgroup_and_those_above_it_are_found_innermost_first() -> None:
    found = capacity.own_cgroups(MOUNTS, SELF_CGROUP)

    assert found == [UNIT / "worker", UNIT, Path("/sys/fs/cgroup/system.slice")]
    assert capacity.own_cgroups("proc /proc proc rw 0 0\n", SELF_CGROUP) == []  # no cgroup2
    assert capacity.own_cgroups(MOUNTS, "0::/\n") == []  # the root: no limits


def test_cpus_are_the_affinity_bounded_by_the_tightest_quota_above() -> None:
    cgroups = capacity.own_cgroups(MOUNTS, SELF_CGROUP)
    quota = {UNIT / "worker" / "cpu.max": "max 100000\n", UNIT / "cpu.max": "150000 100000\n"}

    assert capacity.bounded_cpus(8, cgroups, _files(quota)) == 1.5
    assert capacity.bounded_cpus(1, cgroups, _files(quota)) == 1.0
    assert capacity.bounded_cpus(8, cgroups, _files({})) == 8.0  # no cpu controller there


def test_memory_is_memtotal_bounded_by_the_tightest_memory_max_above() -> None:
    cgroups = capacity.own_cgroups(MOUNTS, SELF_CGROUP)
    limit = {UNIT / "memory.max": f"{4096 * 2**20}\n", UNIT / "worker" / "memory.max": "max\n"}

    assert capacity.mem_total_mb(MEMINFO) == 15921
    assert capacity.bounded_memory_mb(MEMINFO, cgroups, _files(limit)) == 4096
    assert capacity.bounded_memory_mb(MEMINFO, cgroups, _files({})) == 15921


def test_gpus_are_the_devices_nvidia_smi_lists_or_the_setting() -> None:
    assert capacity.nvidia_gpu_ids(NVIDIA_SMI) == ("0", "1")
    assert capacity.nvidia_gpu_ids("") == ()
    assert capacity.parse_gpu_ids("0, 2,,2") == ("0", "2")
    assert capacity.parse_gpu_ids("") == ()


def test_what_is_set_wins_and_only_what_is_not_is_detected() -> None:
    found = HostCapacity.of(2, 8000, ("0",))
    calls: list[int] = []

    def detected() -> HostCapacity:
        calls.append(1)
        return found

    assert capacity.decide(0.5, 1000, "", detected=detected) == HostCapacity.of(0.5, 1000)
    assert calls == []  # all set: nothing detected
    assert capacity.decide(None, 1000, None, detected=detected) == HostCapacity.of(2, 1000, ("0",))
    # legacy: VIGIL_WORKER_SLOTS set and VIGIL_HOST_CPUS not: that many CPUs
    assert capacity.decide(None, None, None, 6, detected).resources == Resources(6000, 8000, 1)
    assert capacity.decide(3, None, None, 6, detected).resources.millicpus == 3000


def test_slots_are_the_cpus_rounded_up_for_what_still_shows_slots() -> None:
    assert HostCapacity.of(0.5, 0).slots == 1
    assert HostCapacity.of(2.5, 0).slots == 3
    assert HostCapacity.of(4, 0).describe() == "4 cpus, 0 MiB, no gpu"
    assert HostCapacity.of(1, 512, ("0", "1")).describe() == "1 cpu, 512 MiB, gpus 0,1"


def test_the_workers_settings_read_the_host_and_take_slots_as_cpus_only_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capacity, "detect", lambda: HostCapacity.of(2, 8000))
    monkeypatch.setenv("VIGIL_HOST_GPUS", "")
    monkeypatch.setenv("VIGIL_HOST_MEMORY_MB", "1024")

    assert WorkerSettings().capacity() == HostCapacity.of(2, 1024)  # slots' default: no say
    monkeypatch.setenv("VIGIL_WORKER_SLOTS", "3")
    assert WorkerSettings().capacity() == HostCapacity.of(3, 1024)
    monkeypatch.setenv("VIGIL_HOST_CPUS", "0.75")
    monkeypatch.setenv("VIGIL_HOST_GPUS", "0,1")
    assert WorkerSettings().capacity() == HostCapacity.of(0.75, 1024, ("0", "1"))
