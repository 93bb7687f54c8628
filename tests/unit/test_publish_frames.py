"""A batch's frames, written by hand (`batch_publish.publish_frames`), are pamqp's bytes."""

import pamqp.frame
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from shared.messaging.batch_publish import Outgoing, publish_frames

_NAMES = st.text(st.characters(codec="utf-8"), max_size=60)
#: The headers the relay sends: none (a work message), an event's position.
_HEADERS = st.one_of(st.none(), st.fixed_dictionaries({"seq": st.integers(0, 2**63 - 1)}))
_MESSAGES = st.builds(
    Outgoing,
    exchange=st.from_regex(r"\A[a-zA-Z0-9_.:-]{0,60}\Z"),
    routing_key=_NAMES,
    body=st.binary(max_size=1000),
    mandatory=st.booleans(),
    headers=_HEADERS,
)


def _pamqp(channel: int, max_content: int, message: Outgoing, message_id: str) -> bytes:
    properties = Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        message_id=message_id,
        headers=message.headers,
    )
    body = message.body
    frames: list[Basic.Publish | ContentHeader | ContentBody] = [
        Basic.Publish(
            exchange=message.exchange,
            routing_key=message.routing_key,
            mandatory=message.mandatory,
        ),
        ContentHeader(properties=properties, body_size=len(body)),
    ]
    frames += [ContentBody(body[at : at + max_content]) for at in range(0, len(body), max_content)]
    return b"".join(pamqp.frame.marshal(frame, channel) for frame in frames)


@given(
    st.integers(1, 2047),
    st.integers(1, 300),
    _MESSAGES,
    st.text(st.characters(codec="ascii"), min_size=1, max_size=40),
)
def test_a_message_is_written_as_pamqp_writes_it(
    channel: int, max_content: int, message: Outgoing, message_id: str
) -> None:
    assert publish_frames(channel, max_content, message, message_id) == _pamqp(
        channel, max_content, message, message_id
    )


def test_a_key_longer_than_a_short_string_is_refused() -> None:
    message = Outgoing("vigil.work", "é" * 128, b"{}", True)
    with pytest.raises(ValueError, match="too long"):
        publish_frames(1, 100, message, "id")
