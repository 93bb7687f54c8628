"""What this host has to run tasks with: its CPUs, memory and GPU devices. Its
worker advertises it at registration (`hosts.capacity_*`, `hosts.gpu_ids`), where the leading
scheduler places tasks by it, and admits the tasks it is sent by it
(`services/worker/ledger.py`).

Each is the operator's (`VIGIL_HOST_CPUS`, `VIGIL_HOST_MEMORY_MB`, `VIGIL_HOST_GPUS`), else
detected: the CPUs this process may run on (`sched_getaffinity`), bounded by the `cpu.max` of
its cgroup (v2) and of the cgroups above it (a container's, a systemd unit's quota); the
memory of `/proc/meminfo`, bounded likewise by `memory.max`; the GPUs `nvidia-smi -L` lists,
where the NVIDIA driver is installed. A host that advertised more than it has would be sent
work it runs slower than asked (CPU) or is killed for (memory).

The parsing is pure (the files' texts in, numbers out) so that tests feed it made-up hosts;
`detect()` alone reads this one.
"""

import contextlib
import logging
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shared.domain.scheduling.resources import Resources

logger = logging.getLogger(__name__)

#: One line of `nvidia-smi -L`: `GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-…)`.
_GPU_LINE: Final = re.compile(r"^GPU (\d+):", re.MULTILINE)
#: How long `nvidia-smi -L` may take (a driver that hangs must not keep the worker from
#: starting: it then has no GPUs).
NVIDIA_SMI_TIMEOUT_S: Final = 10.0

#: Reads a file's text (None: absent or unreadable).
Reader = Callable[[Path], str | None]


@dataclass(frozen=True)
class HostCapacity:
    """What the host has: CPUs (millicores) and memory (MiB) in `resources`, with its GPU
    devices by id (`resources.gpus` is their count)."""

    resources: Resources
    gpu_ids: tuple[str, ...] = ()

    @classmethod
    def of(cls, cpus: float, memory_mb: int, gpu_ids: tuple[str, ...] = ()) -> "HostCapacity":
        return cls(Resources.of(cpus, memory_mb, len(gpu_ids)), gpu_ids)

    @property
    def slots(self) -> int:
        """Its CPUs rounded up: as `hosts.slots` showed a host before requests (displays),
        and the count of tasks a legacy pool-queue intake takes (`services/worker/consumer.py`)."""
        return max(1, math.ceil(self.resources.millicpus / 1000))

    def describe(self) -> str:
        """`2 cpus, 7821 MiB, gpus 0,1`: as the worker says it at start."""
        gpus = f", gpus {','.join(self.gpu_ids)}" if self.gpu_ids else ", no gpu"
        cpus = self.resources.millicpus / 1000
        return f"{cpus:g} cpu{'' if cpus == 1 else 's'}, {self.resources.memory_mb} MiB{gpus}"


def decide(
    cpus: float | None,
    memory_mb: int | None,
    gpus: str | None,
    legacy_slots: int | None = None,
    detected: Callable[[], HostCapacity] | None = None,
) -> HostCapacity:
    """The host's capacity from its settings, each one left unset (None) detected.

    `legacy_slots`: `VIGIL_WORKER_SLOTS` when it was set; with no `VIGIL_HOST_CPUS` it is the
    host's CPUs, so that a deployment that set slots runs as many default (1-CPU) tasks at
    once as it did. Detection (`detected`, `detect` by default) runs only when something is
    left to detect."""
    if cpus is None and legacy_slots is not None:
        cpus = float(legacy_slots)
    unset = cpus is None or memory_mb is None or gpus is None
    found = (detected or detect)() if unset else HostCapacity(Resources())
    return HostCapacity.of(
        cpus if cpus is not None else found.resources.millicpus / 1000,
        memory_mb if memory_mb is not None else found.resources.memory_mb,
        parse_gpu_ids(gpus) if gpus is not None else found.gpu_ids,
    )


def parse_gpu_ids(setting: str) -> tuple[str, ...]:
    """`VIGIL_HOST_GPUS` as device ids: `"0,1"` -> ("0", "1"); `""`: none."""
    return tuple(dict.fromkeys(part.strip() for part in setting.split(",") if part.strip()))


def quota_cpus(cpu_max: str) -> float | None:
    """The CPUs a cgroup's `cpu.max` (`"150000 100000"`: 1.5) allows; None for `max` (none)."""
    fields = cpu_max.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100_000
    return int(fields[0]) / period


def limit_mb(memory_max: str) -> int | None:
    """A cgroup's `memory.max` in MiB; None for `max` (none)."""
    value = memory_max.strip()
    if not value or value == "max":
        return None
    return int(value) // 2**20


def mem_total_mb(meminfo: str) -> int:
    """`MemTotal` of `/proc/meminfo`, in MiB (0 when it is not there)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            return int(value.split()[0]) // 1024  # kB
    return 0


def nvidia_gpu_ids(listing: str) -> tuple[str, ...]:
    """The device ids (indexes: "0", "1"…) in the text of `nvidia-smi -L`."""
    return tuple(_GPU_LINE.findall(listing))


def own_cgroups(mounts: str, self_cgroup: str) -> list[Path]:
    """This process's cgroup (v2) and those above it, innermost first, from the texts of
    `/proc/self/mounts` and `/proc/self/cgroup` (empty without a cgroup2 mount). The root is
    left out: it has no limits."""
    mount = next(
        (
            Path(fields[1])
            for fields in (line.split() for line in mounts.splitlines())
            if len(fields) > 2 and fields[2] == "cgroup2"
        ),
        None,
    )
    own = next((line[3:].strip() for line in self_cgroup.splitlines() if line[:3] == "0::"), None)
    if mount is None or own is None:
        return []
    parts = [p for p in own.split("/") if p]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), 0, -1)]


def bounded_cpus(affinity: int, cgroups: list[Path], read: Reader) -> float:
    """`affinity` CPUs, bounded by the tightest `cpu.max` of `cgroups`."""
    quotas = [quota_cpus(text) for text in _texts(cgroups, "cpu.max", read)]
    return min([float(affinity), *(q for q in quotas if q is not None)])


def bounded_memory_mb(meminfo: str, cgroups: list[Path], read: Reader) -> int:
    """The host's memory, bounded by the tightest `memory.max` of `cgroups` (MiB)."""
    limits = [limit_mb(text) for text in _texts(cgroups, "memory.max", read)]
    return min([mem_total_mb(meminfo), *(m for m in limits if m is not None)])


def _texts(cgroups: list[Path], name: str, read: Reader) -> list[str]:
    return [text for text in (read(where / name) for where in cgroups) if text is not None]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _nvidia_smi_listing() -> str:
    """What `nvidia-smi -L` says ("" without the binary, or when it fails: logged)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return ""
    try:
        ran = subprocess.run(
            [binary, "-L"],
            capture_output=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=True,
            text=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("nvidia-smi -L failed, no GPU advertised: %s", exc)
        return ""
    return ran.stdout


def detect() -> HostCapacity:
    """This host's capacity, as this process finds it."""
    cgroups: list[Path] = []
    with contextlib.suppress(OSError):
        cgroups = own_cgroups(
            Path("/proc/self/mounts").read_text(encoding="utf-8"),
            Path("/proc/self/cgroup").read_text(encoding="utf-8"),
        )
    return HostCapacity.of(
        bounded_cpus(len(os.sched_getaffinity(0)), cgroups, _read),
        bounded_memory_mb(_read(Path("/proc/meminfo")) or "", cgroups, _read),
        nvidia_gpu_ids(_nvidia_smi_listing()),
    )
