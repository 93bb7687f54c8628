"""Messaging: the broker (connection, topology, every message on the wire) and Redis (keys,
the worker registration), the ephemeral side of the system."""
