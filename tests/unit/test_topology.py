"""Exchange, queue and routing-key names: namespaced, and never built from unsafe parts."""

import pytest

from shared.messaging.topology import (
    Topology,
    event_key,
    host_key,
    pool_key,
    supervise_key,
)
from shared.runtime.config import DEFAULT_POOL

UNSAFE_PARTS = ["", "a.b", "a*", "#", "Host1", "UPPER", "-leading", "a b", "a:b", "x" * 64]


def test_when_there_is_no_namespace__names_start_with_vigil() -> None:
    topology = Topology()
    assert topology.events_exchange == "vigil.events"
    assert topology.work_exchange == "vigil.work"
    assert topology.dead_letter_exchange == "vigil.dlx"
    assert topology.dead_letter_queue == "vigil.dlq"
    assert topology.pool_queue() == f"vigil.work.pool.{DEFAULT_POOL}"
    assert topology.pool_queue("gpu") == "vigil.work.pool.gpu"
    assert topology.host_queue("h-1") == "vigil.work.host.h-1"
    assert topology.supervisor_queue("h-1") == "vigil.supervise.h-1"


def test_when_there_is_a_namespace__every_name_is_prefixed_by_it() -> None:
    topology = Topology("t123")
    names = [
        topology.events_exchange,
        topology.work_exchange,
        topology.dead_letter_exchange,
        topology.dead_letter_queue,
        topology.pool_queue(),
        topology.host_queue("h-1"),
        topology.supervisor_queue("h-1"),
    ]
    assert all(name.startswith("t123.vigil.") for name in names)
    assert topology.host_queue("h-1") == "t123.vigil.work.host.h-1"


def test_when_two_namespaces_are_used__no_name_is_shared() -> None:
    first, second = Topology("ns-a"), Topology("ns-b")
    assert first.events_exchange != second.events_exchange
    assert first.pool_queue() != second.pool_queue()
    assert first.dead_letter_queue != second.dead_letter_queue


def test_when_routing_to_work_queues__keys_name_the_pool_or_host_without_namespace() -> None:
    assert pool_key() == f"pool.{DEFAULT_POOL}"
    assert pool_key("gpu") == "pool.gpu"
    assert host_key("h-1") == "host.h-1"
    assert supervise_key("h-1") == "supervise.h-1"


@pytest.mark.parametrize("part", UNSAFE_PARTS)
def test_when_a_name_part_is_unsafe__value_error_is_raised(part: str) -> None:
    topology = Topology("ns")
    for build in (
        topology.pool_queue,
        topology.host_queue,
        topology.supervisor_queue,
        pool_key,
        host_key,
        supervise_key,
    ):
        with pytest.raises(ValueError, match="unsafe"):
            build(part)


def test_when_building_an_event_key__it_is_kind_what_and_job() -> None:
    assert event_key("task", "on_cpu", "j-abc123") == "task.on_cpu.j-abc123"
    assert event_key("job", "succeeded", "j-abc123") == "job.succeeded.j-abc123"
    assert event_key("log", "error", "j-abc123") == "log.error.j-abc123"


@pytest.mark.parametrize("part", ["", "a.b", "*", "#", "a#", "On_cpu", "a b", "_x"])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_when_an_event_key_part_is_unsafe__value_error_is_raised(part: str, position: int) -> None:
    parts = ["task", "queued", "j-abc123"]
    parts[position] = part
    with pytest.raises(ValueError, match="unsafe"):
        event_key(*parts)
