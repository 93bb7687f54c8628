"""What a host's quarantine lets its worker take from the pool queue (see
`services/scheduler/breaker.py`): everything, one task at a time (a breaker probing), or
nothing. Work for tasks whose work dirs are here comes through the host queue whatever it is."""

from enum import StrEnum


class Admission(StrEnum):
    OPEN = "open"  # `slots + prefetch` tasks at once
    PROBING = "probing"  # one task at a time, from take to its last stage
    SHUT = "shut"  # none


def of_host(quarantined: bool, probing: bool) -> Admission:
    """The admission of a host with these `hosts` flags."""
    if not quarantined:
        return Admission.OPEN
    return Admission.PROBING if probing else Admission.SHUT
