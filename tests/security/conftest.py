"""The end-to-end fixtures (the four services as processes), for the tests of hostile jobs."""

from tests.e2e.conftest import client, e2e_namespace, events, stack

__all__ = ["client", "e2e_namespace", "events", "stack"]
