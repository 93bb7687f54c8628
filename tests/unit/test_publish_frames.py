"""A work message's frames, written by hand (`batch_publish.plain_frames`), are pamqp's bytes."""

import pamqp.frame
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from shared.messaging.batch_publish import plain_frames

_NAMES = st.text(st.characters(codec="utf-8"), max_size=60)


#: (channel, max_content, exchange, routing key, mandatory, message id, body)
_Args = tuple[int, int, str, str, bool, str, bytes]


def _pamqp(args: _Args) -> bytes:
    channel, max_content, exchange, routing_key, mandatory, message_id, body = args
    properties = Basic.Properties(
        content_type="application/json", delivery_mode=2, message_id=message_id
    )
    frames: list[Basic.Publish | ContentHeader | ContentBody] = [
        Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        ContentHeader(properties=properties, body_size=len(body)),
    ]
    frames += [ContentBody(body[at : at + max_content]) for at in range(0, len(body), max_content)]
    return b"".join(pamqp.frame.marshal(frame, channel) for frame in frames)


@given(
    st.tuples(
        st.integers(1, 2047),
        st.integers(1, 300),
        st.from_regex(r"\A[a-zA-Z0-9_.:-]{0,60}\Z"),
        _NAMES,
        st.booleans(),
        st.text(st.characters(codec="ascii"), min_size=1, max_size=40),
        st.binary(max_size=1000),
    )
)
def test_a_plain_message_is_written_as_pamqp_writes_it(args: _Args) -> None:
    assert plain_frames(*args) == _pamqp(args)


def test_a_key_longer_than_a_short_string_is_refused() -> None:
    with pytest.raises(ValueError, match="too long"):
        plain_frames(1, 100, "vigil.work", "é" * 128, True, "id", b"{}")
