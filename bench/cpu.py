"""Where a run's CPU goes: user + system time of each Vigil service, PostgreSQL, RabbitMQ and
Redis (and of the children they reaped: the worker's are the commands and what starts them),
over the run of a command.

    python -m bench.cpu -- python ../shared/peers/vigil_throughput.py -n 0 --onejob 1500

Prints one line per process kind, then the total and how busy the machine was.
"""

import argparse
import subprocess
import sys
import time

import psutil


def _kind(process: psutil.Process) -> str | None:
    """The service or server a process belongs to, or None."""
    try:
        name = process.name()
        command = " ".join(process.cmdline())
    except (psutil.Error, OSError):
        return None
    if "-m services." in command and not command.startswith(("bash", "/bin/bash")):
        return command.split("-m services.", 1)[1].split()[0]
    if name.startswith("postgres"):
        return "postgres"
    if name.startswith("beam"):
        return "rabbitmq"
    if name.startswith("redis"):
        return "redis"
    return None


def snapshot() -> dict[str, float]:
    """CPU seconds so far per kind (`<kind>+children` for what each one reaped)."""
    seconds: dict[str, float] = {}
    for process in psutil.process_iter():
        kind = _kind(process)
        if kind is None:
            continue
        try:
            t = process.cpu_times()
        except (psutil.Error, OSError):
            continue
        seconds[kind] = seconds.get(kind, 0.0) + t.user + t.system
        reaped = t.children_user + t.children_system
        if reaped:
            seconds[f"{kind}+children"] = seconds.get(f"{kind}+children", 0.0) + reaped
    return seconds


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core, the kernel's threads too)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    before, started, machine = snapshot(), time.monotonic(), _machine_busy()
    returncode = subprocess.run(command, check=False).returncode
    after, wall = snapshot(), time.monotonic() - started
    machine = _machine_busy() - machine
    total = 0.0
    for kind in sorted(after):
        used = after[kind] - before.get(kind, 0.0)
        total += used
        print(f"{kind:20s} {used:8.2f} s  {100 * used / wall:5.1f} % of a core")
    print(f"{'all':20s} {total:8.2f} s over {wall:.2f} s: {100 * total / wall:.0f} % of a core")
    print(
        f"{'machine':20s} {machine:8.2f} s busy, {100 * machine / wall:.0f} % of a core"
        f" ({machine - total:.2f} s elsewhere: the client, the kernel's threads, ...)"
    )
    sys.exit(returncode)


if __name__ == "__main__":
    main()
