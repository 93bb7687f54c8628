"""A RabbitMQ cluster's nodes: a connection is to one node at a time, and goes to the next.

`VIGIL_AMQP_URL` names one node, or several separated by commas (the nodes of one cluster:
`amqp://u:p@mq1:5672/,amqp://u:p@mq2:5672/`). aio-pika's robust connection reconnects to
the URL it was made with; `NodeConnection` hands aio-pika the next node at each attempt, so a
connection whose node stopped is made again on another, with its channels, consumers and
declarations restored there (the queues are quorum queues, replicated on every node).
"""

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from aio_pika import RobustConnection
from yarl import URL

#: Seconds between two attempts of a robust connection to (re)connect (aio-pika's default
#: is 5): each attempt goes to the next node, so a stopped one costs a second, not five.
RECONNECT_INTERVAL_S: Final = 1.0


def node_urls(url: str) -> list[str]:
    """The nodes of `url` (one URL, or several separated by commas); raises `ValueError` for
    an empty list or an entry that is not an amqp:// or amqps:// URL."""
    nodes = [part.strip() for part in url.split(",") if part.strip()]
    if not nodes:
        raise ValueError("VIGIL_AMQP_URL names no node")
    for node in nodes:
        if URL(node).scheme not in ("amqp", "amqps") or not URL(node).host:
            raise ValueError(f"VIGIL_AMQP_URL: {hidden(node)!r} is not an amqp:// URL")
    return nodes


def hidden(url: str | URL) -> str:
    """`url` with its password masked, for logs and errors."""
    parts = URL(str(url))
    return str(parts.with_password("***")) if parts.password else str(parts)


class NodeConnection(RobustConnection):
    """A robust connection over a cluster's nodes, starting with node `first` (modulo their
    number): every attempt to connect, the first and each after a loss, reads `url`, which
    gives the next node in turn."""

    def __init__(
        self,
        nodes: Sequence[str],
        first: int = 0,
        loop: asyncio.AbstractEventLoop | None = None,
        **kwargs: Any,
    ) -> None:
        self._nodes = tuple(URL(node) for node in nodes)
        self._turn = first
        super().__init__(self._nodes[first % len(self._nodes)], loop, **kwargs)
        self._turn = first  # the constructor read `url` once (its query's parameters)

    @property
    def url(self) -> URL:
        node = self._nodes[self._turn % len(self._nodes)]
        self._turn += 1
        return node

    @url.setter
    def url(self, value: URL) -> None:
        """Set by aio-pika's constructor to the first node: the nodes stay as given."""

    @property
    def node(self) -> URL:
        """The node of the last attempt to connect (the one in use once connected)."""
        return self._nodes[(self._turn - 1) % len(self._nodes)]

    def __str__(self) -> str:
        return hidden(self.node)


async def connect_to_a_node(
    url: str, name: str, open_timeout_s: float, first: int = 0
) -> RobustConnection:
    """A robust connection to one node of `url` (node `first` first); raises what aio-pika
    raises if that node does not answer (the caller tries again: the next node)."""
    nodes = node_urls(url)
    connection = NodeConnection(
        nodes,
        first,
        client_properties={"connection_name": name},
        reconnect_interval=RECONNECT_INTERVAL_S,
    )
    try:
        await connection.connect(timeout=open_timeout_s)
    except BaseException:
        await connection.close()  # its reconnection task, else left pending
        raise
    return connection
