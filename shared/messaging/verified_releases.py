"""The releases of aio-pika, aiormq and pamqp that the publishing path was checked against.

Publishing a relay batch fast needs what aiormq does not offer publicly: `frame_batching`
replaces aiormq's `FrameGenerator` and raises `Connection.FRAME_BUFFER_SIZE`, and
`batch_publish` numbers, registers and queues a batch's publishes under a channel's lock
through the channel's own state. Vigil pins the three libraries exactly in `pyproject.toml`
(and so in `requirements.lock`), and `tests/unit/test_verified_releases.py` fails when what is
installed or pinned differs from `VERIFIED`, naming `RECHECK`. Moving to another release means
re-checking each point of `RECHECK` against its source, running the tests named there, then
changing the pins here and in `pyproject.toml` together (`scripts/lock`).
"""

from collections.abc import Mapping
from typing import Final

#: Distribution name -> the exact release the publishing path was checked against.
VERIFIED: Final[Mapping[str, str]] = {"aio-pika": "10.2.1", "aiormq": "7.2.4", "pamqp": "4.0.1"}

#: What to re-check in a new release before changing `VERIFIED`.
RECHECK: Final = (
    "aiormq.connection.Connection's writer still iterates a `FrameGenerator` it looks up by "
    "name in aiormq.connection, over `Connection.FRAME_BUFFER_SIZE`-bounded `write_queue` "
    "(shared/messaging/frame_batching.py; tests/unit/test_frame_batching.py)",
    "aiormq.Channel still keeps `lock`, `delivery_tag`, `confirmations` (tag -> future), "
    "`message_id_delivery_tag`, `write_queue`, `max_content_size`, `number` and "
    "`create_future`, and resolves confirms and returns through them "
    "(shared/messaging/batch_publish.py; tests/integration/test_batch_publish.py)",
    "pamqp still writes a publish's frames byte for byte as `publish_frames` does, and "
    "`pamqp.encode.field_table` still encodes headers (tests/unit/test_publish_frames.py)",
    "aio-pika's channel still hands over its aiormq channel (`get_underlay_channel`, "
    "shared/messaging/amqp.py) and the relay still publishes as fast "
    "(python -m bench.relay --tasks 8000, before and after)",
)
