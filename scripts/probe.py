"""Does a real PostgreSQL / RabbitMQ / Redis answer at host:port? Stdlib only.

    python3 scripts/probe.py postgresql|rabbitmq|redis HOST PORT [TIMEOUT]

Exit 0 when the server speaks its protocol, 1 when nothing (or something else) answers. An open
port is not enough: proxies and other programs accept connections too, so each probe sends the
protocol's opening bytes and checks the reply.
"""

import socket
import struct
import sys

# PostgreSQL SSLRequest: the server answers a single byte, 'S' or 'N' (or 'E' if too old).
PG_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
# AMQP 0-9-1 protocol header: the server answers with a Connection.Start method frame (type 1),
# or with its own protocol header ("AMQP...") when it wants another version.
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
REDIS_PING = b"PING\r\n"


def probe(kind: str, host: str, port: int, timeout: float) -> bool:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        if kind == "postgresql":
            sock.sendall(PG_SSL_REQUEST)
            return sock.recv(1) in (b"S", b"N", b"E")
        if kind == "rabbitmq":
            sock.sendall(AMQP_HEADER)
            reply = sock.recv(8)
            return reply[:1] == b"\x01" or reply[:4] == b"AMQP"
        if kind == "redis":
            sock.sendall(REDIS_PING)
            reply = sock.recv(64)
            # +PONG, or an error such as -NOAUTH / -LOADING from a real Redis.
            return reply.startswith(b"+PONG") or reply.startswith(b"-")
    raise ValueError(f"unknown server kind {kind!r}")


def main() -> int:
    kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    try:
        return 0 if probe(kind, host, port, timeout) else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
