"""What queues and exchanges a namespace has on the broker, as `rabbitmqctl` lists them (AMQP
cannot list them): the tests that a host's queues end with the host read it."""

import subprocess


def queues_of(namespace: str) -> set[str]:
    """The broker's queues of `namespace`."""
    return _listed("list_queues", namespace)


def exchanges_of(namespace: str) -> set[str]:
    """The broker's exchanges of `namespace`."""
    return _listed("list_exchanges", namespace)


def _listed(what: str, namespace: str) -> set[str]:
    listed = subprocess.run(
        ["rabbitmqctl", what, "-q", "--no-table-headers", "name"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {name for name in listed.stdout.split() if name.startswith(namespace + ".")}
