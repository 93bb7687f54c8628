"""What sealing a job's command costs at its start: the CPU time (user + system, of every
process of the chain, children included) of `--starts` confined `bash -c true`, started one
after another the way the worker starts them (their gate's line written, their exit awaited),
through the chain before the seal (`nsenter --net --setgid --setuid`, BusyBox's where there is
one, bash's own gate) and through the sealed one (`confinement.py`): its gate and pid 1
compiled (where there is a `cc`), and through `sh`, `nsenter` and perl. Run it as root, alone.

    python -m bench.seal_cost --starts 200
"""

import argparse
import dataclasses
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from services.worker import confinement, process
from services.worker.confinement import Confinement

UID_BASE = 2_000_000


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _started(argv: Sequence[str], workdir: Path, env: dict[str, str], report: int | None) -> None:
    fds = () if report is None else (report,)
    child = subprocess.Popen(
        argv, cwd=workdir, env=env, stdin=subprocess.PIPE, pass_fds=fds, start_new_session=True
    )
    assert child.stdin is not None
    child.stdin.write(b"go\n")
    child.stdin.close()
    if child.wait() != 0:
        raise RuntimeError(f"{argv[:3]}... exited {child.returncode}")


def _cost(starts: int, start: Callable[[], None]) -> tuple[float, float]:
    """(CPU ms, wall ms) a start, over `starts`."""
    cpu, wall = _children_cpu(), time.perf_counter()
    for _ in range(starts):
        start()
    return (
        (_children_cpu() - cpu) * 1000 / starts,
        (time.perf_counter() - wall) * 1000 / starts,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=200)
    starts = parser.parse_args().starts
    if confinement.forbid_new_privileges() is not None or os.geteuid() != 0:
        raise SystemExit("run it as root")
    held = Confinement(UID_BASE, busybox=shutil.which(confinement.BUSYBOX))
    root = Path(tempfile.mkdtemp(prefix="vigil-seal-cost-"))
    try:
        workdir = root / "job" / "task"
        workdir.mkdir(parents=True)
        held.hand_over(root, workdir, 1)
        env = {"PATH": os.environ["PATH"]}
        uid = str(held.uid_of(1))
        net = f"--net={held.network_of(1)}"
        before = (
            [held.busybox, "nsenter", net, f"-G{uid}", f"-S{uid}", "--"]
            if held.busybox
            else ["nsenter", net, f"--setgid={uid}", f"--setuid={uid}", "--"]
        )
        gated = {**env, "BASH_ENV": str(process._gate_file())}
        read, write = os.pipe()
        os.set_blocking(read, False)

        def sealed_by(init: str | None) -> Callable[[], None]:
            sealer = dataclasses.replace(held, init=init).sealer(root, workdir, 1, "none")

            def sealed() -> None:
                _started([*sealer(write), "bash", "-c", "true"], workdir, env, write)
                if os.read(read, 64) != b"0\n":
                    raise RuntimeError("pid 1 reported no exit 0")

            return sealed

        def nsentered() -> None:
            _started([*before, "bash", "-c", "true"], workdir, gated, None)

        chains: list[tuple[str, Callable[[], None]]] = [
            ("before (nsenter)", nsentered),
            ("sealed (bwrap), through sh, nsenter and perl", sealed_by(None)),
        ]
        compiled = confinement.compiled_init()
        if compiled is not None:
            chains.append(("sealed (bwrap), through vigil-init compiled", sealed_by(compiled)))
        for name, start in chains:
            start()  # warm
            cpu, wall = _cost(starts, start)
            print(f"{name}: {cpu:.2f} ms of CPU a start, {wall:.2f} ms wall ({starts} starts)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
