"""What queues a namespace has on the broker, as `rabbitmqctl` lists them (AMQP cannot list
them): the tests that a host's queues end with the host read it."""

import subprocess


def queues_of(namespace: str) -> set[str]:
    """The broker's queues of `namespace`."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {name for name in listed.stdout.split() if name.startswith(namespace + ".")}
