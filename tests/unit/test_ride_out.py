"""`shared.runtime.ride_out`: work made again while the database restarts, and only then."""

import asyncpg
import pytest

from shared.runtime.ride_out import ride_out


async def test_a_call_that_meets_a_lost_connection_is_made_again_until_it_works() -> None:
    tries = []

    async def call() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise asyncpg.CannotConnectNowError("the database system is starting up")
        return "done"

    assert await ride_out(call, "testing") == "done"
    assert len(tries) == 3


async def test_any_other_error_is_raised_at_once() -> None:
    tries = []

    async def call() -> None:
        tries.append(1)
        raise asyncpg.UniqueViolationError("duplicate key")

    with pytest.raises(asyncpg.UniqueViolationError):
        await ride_out(call, "testing")
    assert len(tries) == 1


async def test_a_database_away_longer_than_the_ride_out_raises_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shared.runtime.ride_out.RIDE_OUT_S", 0.15)

    async def call() -> None:
        raise ConnectionRefusedError(111, "Connect call failed")

    with pytest.raises(ConnectionRefusedError):
        await ride_out(call, "testing")
