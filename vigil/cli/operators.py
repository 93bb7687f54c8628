"""Operators' commands: `hosts`, `pilots`, `analysers`, `emergency-stop`, `resume-all`."""

from enum import StrEnum
from typing import Annotated, Any

import typer

from vigil import render
from vigil.cli.base import JsonFlag, command, out, print_json, session
from vigil.errors import UsageError

# -- operators --------------------------------------------------------------------------------


class HostVerb(StrEnum):
    """What `vigil hosts VERB HOST` does to a host (operators only)."""

    DRAIN = "drain"  # finish what it holds, take nothing new
    UNDRAIN = "undrain"
    QUARANTINE = "quarantine"  # take nothing new for --duration (a wall, not a breaker)
    RELEASE = "release"  # end its quarantine
    RM = "rm"  # remove it from the fleet (--force: even alive and holding tasks)


@command()
def hosts(
    ctx: typer.Context,
    verb: Annotated[
        HostVerb | None,
        typer.Argument(help="drain, undrain, quarantine, release or rm HOST."),
    ] = None,
    host: Annotated[str | None, typer.Argument(help="The host's id.")] = None,
    reason: Annotated[str, typer.Option(help="Why (quarantine).")] = "",
    duration: Annotated[
        float | None, typer.Option(min=1, help="Seconds a quarantine lasts (default: 7 days).")
    ] = None,
    force: Annotated[
        bool, typer.Option(help="rm a host even alive and holding tasks (they are lost).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """List the worker hosts; or drain, undrain, quarantine, release or remove one."""
    if verb is None:
        with session(ctx).client() as client:
            found = client.hosts()
        if as_json:
            print_json(found)
        else:
            out.print(render.hosts_table(found))
        return
    if host is None:
        raise UsageError(f"vigil hosts {verb.value} needs a HOST")
    fields: dict[str, Any] = {}
    if verb is HostVerb.QUARANTINE:
        fields = {"reason": reason, "duration_s": duration}
    with session(ctx).client() as client:
        if verb is HostVerb.RM:
            done = client.remove_host(host, force=force)
            said = f"host {host}: removed, {done['tasks_lost']} task(s) lost"
        else:
            done = client.host_action(host, verb.value, **fields)
            said = f"host {host}: {verb.value} accepted"
    if as_json:
        print_json(done)
    else:
        print(render.printable(said))


class PilotVerb(StrEnum):
    """What `vigil pilots VERB` does (`add` and `rm`: operators only)."""

    LS = "ls"  # list them
    ADD = "add"  # ask the batch system for more
    RM = "rm"  # stop one: its batch job is cancelled


@command()
def pilots(
    ctx: typer.Context,
    verb: Annotated[PilotVerb, typer.Argument(help="ls, add, or rm PILOT.")] = PilotVerb.LS,
    pilot: Annotated[str | None, typer.Argument(help="The pilot's id (rm).")] = None,
    count: Annotated[int, typer.Option(min=1, help="How many pilots (add).")] = 1,
    walltime: Annotated[int, typer.Option(min=60, help="Each one's walltime, seconds.")] = 3600,
    cpus: Annotated[int, typer.Option(min=1, help="Each one's CPUs.")] = 1,
    memory_mb: Annotated[int | None, typer.Option(min=1, help="Each one's memory, MiB.")] = None,
    gpus: Annotated[int, typer.Option(min=0, help="Each one's GPUs.")] = 0,
    live: Annotated[bool, typer.Option(help="Only those not ended (ls).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """List the pilots (hosts run as batch jobs); or add some, or stop one."""
    with session(ctx).client() as client:
        if verb is PilotVerb.LS:
            found: Any = client.pilots(live=live)
        elif verb is PilotVerb.ADD:
            found = client.add_pilots(
                count=count, walltime_s=walltime, cpus=cpus, memory_mb=memory_mb, gpus=gpus
            )
        elif pilot is None:
            raise UsageError("vigil pilots rm needs a PILOT")
        else:
            found = [client.remove_pilot(pilot)]
    if as_json:
        print_json(found)
    else:
        out.print(render.pilots_table(found))


@command()
def analysers(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the analysers a job's policy may name."""
    with session(ctx).client() as client:
        found = client.analysers()
    if as_json:
        print_json(found)
    else:
        for name in found:
            print(render.printable(name))


@command("emergency-stop")
def emergency_stop(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option(help="Why: kept with the stop.")],
) -> None:
    """Suspend every job and kill all running work (operators)."""
    with session(ctx).client() as client:
        stop = client.emergency_stop(reason)
    print(render.printable(render.stop_summary(stop)))


@command("resume-all")
def resume_all(ctx: typer.Context) -> None:
    """Lift an emergency stop (operators)."""
    with session(ctx).client() as client:
        resumed = client.resume_all()
    print(render.printable(render.resume_summary(resumed)))
