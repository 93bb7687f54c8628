"""The api's server loop: it sleeps between ticks and a signal ends it at once."""

import asyncio
import signal
from typing import cast

import pytest
import uvicorn

from services.api import __main__ as api_main
from services.api.event_hub import EventHub


async def _app(scope: object, receive: object, send: object) -> None:  # never called
    raise AssertionError("no request is served here")


async def test_when_a_signal_comes__the_main_loop_ends_without_waiting_for_its_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: a loop whose tick is far longer than the wait below
    monkeypatch.setattr(api_main, "_TICK_S", 600.0)
    server = api_main._Server(uvicorn.Config(_app), cast(EventHub, None))
    server.config.load()
    running = asyncio.create_task(server.main_loop())
    await asyncio.sleep(0)  # the loop has ticked once and sleeps
    assert not running.done()
    assert any(name == b"date" for name, _ in server.server_state.default_headers)

    # when
    server.handle_exit(signal.SIGTERM, None)

    # then
    await asyncio.wait_for(running, timeout=5)
