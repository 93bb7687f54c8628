"""What a host's quarantine (see `services/scheduler/breaker.py`) and an operator's drain let
its worker take from the legacy pool queue (still consumed so that an upgrade from a version
with one shared queue loses nothing; nothing publishes to it now): everything, one task at a
time (a breaker probing), or nothing. The planning round places work on the host's own queue
by the same rules (`services/scheduler/planning.py`), and a task's later stages come through
that queue whatever the admission, so a draining host finishes what it holds."""

from enum import StrEnum


class Admission(StrEnum):
    OPEN = "open"  # as many tasks as the intake takes (`consumer.py`)
    PROBING = "probing"  # one task at a time, from take to its last stage
    SHUT = "shut"  # none


def of_host(quarantined: bool, probing: bool, draining: bool = False) -> Admission:
    """The admission of a host with these `hosts` flags."""
    if draining:
        return Admission.SHUT
    if not quarantined:
        return Admission.OPEN
    return Admission.PROBING if probing else Admission.SHUT
