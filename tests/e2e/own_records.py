"""What jobs record of themselves, to judge placement by: each run writes its own start and end
(`date +%s.%N`, read from inside the command, after it was admitted and before it exits), its
CPU request, the CPU quota the kernel holds it to (its cpu cgroup's, v1 or v2, as it reads it
from /proc/self/cgroup) and the GPUs it was given (`CUDA_VISIBLE_DEVICES`) to a file of a shared
dir, and holds a lock dir per device while it runs (`mkdir` is atomic: a second holder of a
device records a clash). Nothing here reads what the services wrote."""

import itertools
import shlex
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Final

#: Sets `quota` to the CPUs the run's cpu cgroup allows (`none`: no quota, or none seen).
_QUOTA: Final = r"""quota=none
v1=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
v2=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
if [ -n "$v1" ] && [ -r "/sys/fs/cgroup/cpu$v1/cpu.cfs_quota_us" ]; then
  read -r q < "/sys/fs/cgroup/cpu$v1/cpu.cfs_quota_us"
  read -r period < "/sys/fs/cgroup/cpu$v1/cpu.cfs_period_us"
elif [ -n "$v2" ] && [ -r "/sys/fs/cgroup$v2/cpu.max" ]; then
  read -r q period < "/sys/fs/cgroup$v2/cpu.max"
fi
case "${q:-max}" in
  max|-1) ;;
  *) quota=$(awk -v q="$q" -v p="$period" 'BEGIN {print q / p}') ;;
esac
"""


def recording(shared: Path, cpus: float, work: str = "sleep 1") -> str:
    """A command that runs `work` between its own start and end lines, in
    `shared/run.<task>.<attempt>`, holding `shared/gpu-<id>.lock` for each device it sees."""
    record = shlex.quote(str(shared)) + '/run."$VIGIL_TASK_ID.$VIGIL_ATTEMPT"'
    locks = shlex.quote(str(shared)) + '/gpu-"$d".lock'
    return (
        _QUOTA + 'devices="${CUDA_VISIBLE_DEVICES-unset}"\n'
        f'echo "start $(date +%s.%N) cpus={cpus} quota=$quota gpus=[$devices]" >> {record}\n'
        "for d in ${CUDA_VISIBLE_DEVICES//,/ }; do\n"
        f'  mkdir {locks} 2>/dev/null || echo "clash gpu $d" >> {record}\n'
        "done\n"
        f"{work}\n"
        f"for d in ${{CUDA_VISIBLE_DEVICES//,/ }}; do rmdir {locks}; done\n"
        f'echo "end $(date +%s.%N)" >> {record}\n'
    )


@dataclass(frozen=True)
class Run:
    """One run of a command, as it recorded itself."""

    name: str
    start: Decimal
    end: Decimal
    cpus: Decimal  # what its job asked for
    quota: Decimal | None  # what its cpu cgroup allows it; None: no quota seen
    gpus: str  # CUDA_VISIBLE_DEVICES as the command saw it; `unset` when it was not set
    clashes: tuple[str, ...]

    @property
    def devices(self) -> set[str]:
        return set() if self.gpus in ("", "unset") else set(self.gpus.split(","))


def runs(shared: Path) -> list[Run]:
    """Every run recorded in `shared`; a run without its end line fails the test."""
    found = []
    for path in sorted(shared.glob("run.*")):
        lines = path.read_text().splitlines()
        [start] = [line.split() for line in lines if line.startswith("start ")]
        ends = [line.split() for line in lines if line.startswith("end ")]
        assert len(ends) == 1, f"{path.name} recorded no end (or two): {lines}"
        found.append(
            Run(
                name=path.name,
                start=Decimal(start[1]),
                end=Decimal(ends[0][1]),
                cpus=Decimal(start[2].removeprefix("cpus=")),
                quota=None
                if start[3] == "quota=none"
                else Decimal(start[3].removeprefix("quota=")),
                gpus=start[4].removeprefix("gpus=[").removesuffix("]"),
                clashes=tuple(line for line in lines if line.startswith("clash ")),
            )
        )
    return found


def most_cpus_at_once(found: list[Run]) -> Decimal:
    """The most CPUs the runs held at one instant (an end before a start at the same one): each
    its quota, or its request where it saw none."""
    held_by = [(r, r.cpus if r.quota is None else r.quota) for r in found]
    edges = sorted([(r.start, 1, c) for r, c in held_by] + [(r.end, 0, -c) for r, c in held_by])
    held = most = Decimal(0)
    for _, _, step in edges:
        held += step
        most = max(most, held)
    return most


def most_at_once(found: list[Run]) -> int:
    """How many of the runs ran at one instant, at the most."""
    ones = [Run(r.name, r.start, r.end, Decimal(1), None, r.gpus, r.clashes) for r in found]
    return int(most_cpus_at_once(ones))


def shared_devices(found: list[Run]) -> list[tuple[str, str, set[str]]]:
    """Each pair of runs that overlapped in time and saw a device in common, with the devices."""
    return [
        (a.name, b.name, a.devices & b.devices)
        for a, b in itertools.combinations(found, 2)
        if a.start < b.end and b.start < a.end and a.devices & b.devices
    ]
