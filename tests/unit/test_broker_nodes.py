"""Reading a cluster's nodes from `VIGIL_AMQP_URL` (`shared.messaging.nodes`)."""

import pytest

from shared.messaging.nodes import NodeConnection, hidden, node_urls

A = "amqp://u:secret@mq1:5672/"
B = "amqps://u:secret@mq2:5671/vh"


def test_one_url_is_one_node_and_commas_separate_several() -> None:
    assert node_urls(A) == [A]
    assert node_urls(f" {A} , {B} ,") == [A, B]


@pytest.mark.parametrize("bad", ["", " , ", "http://mq1/", f"{A},mq2:5672", "amqp:///"])
def test_what_is_not_a_list_of_amqp_urls_is_refused_without_its_password(bad: str) -> None:
    with pytest.raises(ValueError, match="VIGIL_AMQP_URL") as refused:
        node_urls(bad)
    assert "secret" not in str(refused.value)


def test_a_password_is_masked() -> None:
    assert hidden(A) == "amqp://u:***@mq1:5672/"
    assert hidden("amqp://mq1/") == "amqp://mq1/"


async def test_each_attempt_to_connect_reads_the_next_node_in_turn() -> None:
    connection = NodeConnection([A, B], first=1)
    assert [connection.url.host for _ in range(3)] == ["mq2", "mq1", "mq2"]
    assert connection.node.host == "mq2"
    assert "secret" not in str(connection)
