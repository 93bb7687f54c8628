"""What a host's flags let its worker take from the pool queue."""

import pytest

from services.worker.admission import Admission, of_host


@pytest.mark.parametrize(
    ("quarantined", "probing", "draining", "expected"),
    [
        (False, False, False, Admission.OPEN),
        (True, False, False, Admission.SHUT),  # a breaker shut, or an operator's quarantine
        (True, True, False, Admission.PROBING),  # one task at a time
        (False, False, True, Admission.SHUT),  # drained: nothing new
        (True, True, True, Admission.SHUT),  # a drain wins over a probe
    ],
)
def test_a_hosts_flags_give_its_admission(
    quarantined: bool, probing: bool, draining: bool, expected: Admission
) -> None:
    assert of_host(quarantined, probing, draining) is expected
