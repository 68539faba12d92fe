"""unwrapping_groups: a lone failure leaves a nursery as itself, even while an
enclosing scope is being cancelled (the replication links rely on `except LinkError`)."""

from __future__ import annotations

import pytest
import trio

from amps_py.trio_util import unwrapping_groups


class Boom(Exception):
    pass


async def test_lone_failure_is_raised_as_itself() -> None:
    async def fail() -> None:
        raise Boom("x")

    with pytest.raises(Boom):
        async with unwrapping_groups(), trio.open_nursery() as nursery:
            nursery.start_soon(fail)
            await trio.sleep_forever()


async def test_lone_failure_beside_cancelled_siblings_is_raised_as_itself() -> None:
    caught: list[BaseException] = []
    with trio.CancelScope() as outer:

        async def fail_then_cancel_outer() -> None:
            await trio.lowlevel.checkpoint()
            outer.cancel()  # the siblings now end with Cancelled
            raise Boom("y")

        try:
            async with unwrapping_groups(), trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                nursery.start_soon(fail_then_cancel_outer)
        except Boom as exc:
            caught.append(exc)
    assert len(caught) == 1


async def test_two_failures_stay_a_group() -> None:
    async def fail() -> None:
        raise Boom("z")

    with pytest.raises(BaseExceptionGroup) as info:
        async with unwrapping_groups(), trio.open_nursery() as nursery:
            nursery.start_soon(fail)
            nursery.start_soon(fail)
    assert len(info.value.exceptions) == 2


async def test_expected_failures_of_one_cause_raise_the_first_listed_kind() -> None:
    class Closed(Exception):
        pass

    async def fail(exc: Exception) -> None:
        raise exc

    with pytest.raises(Boom):
        async with unwrapping_groups((Boom, Closed)), trio.open_nursery() as nursery:
            nursery.start_soon(fail, Closed())
            nursery.start_soon(fail, Boom())
    # an unexpected one beside them keeps the group, so a bug stays visible
    with pytest.raises(BaseExceptionGroup):
        async with unwrapping_groups((Boom,)), trio.open_nursery() as nursery:
            nursery.start_soon(fail, Boom())
            nursery.start_soon(fail, ValueError())
