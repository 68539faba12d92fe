"""``publish --rate``: the pacing of a file's lines (``amps_py.cli.common.Pacer``), on trio's
virtual clock so the figures are exact."""

from __future__ import annotations

import trio
import trio.testing

from amps_py.cli.common import Pacer


async def test_calls_are_spaced_one_over_the_rate_apart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pacer = Pacer(10)
    start = trio.current_time()
    returned = []
    for _ in range(5):
        await pacer.wait()
        returned.append(round(trio.current_time() - start, 9))
    assert returned == [0.0, 0.1, 0.2, 0.3, 0.4]


async def test_no_rate_never_waits(autojump_clock: trio.testing.MockClock) -> None:
    pacer = Pacer(None)
    start = trio.current_time()
    for _ in range(1000):
        await pacer.wait()
    assert trio.current_time() == start


async def test_a_slow_caller_catches_up_but_never_bursts_past_a_second(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pacer = Pacer(10)
    start = trio.current_time()
    await pacer.wait()
    await trio.sleep(0.35)  # the server was slow: 3 calls are overdue
    for _ in range(3):
        await pacer.wait()
    assert trio.current_time() - start == 0.35  # caught up without waiting
    await pacer.wait()
    assert round(trio.current_time() - start, 9) == 0.4  # back on the beat
    await trio.sleep(5)  # a long stall: 50 calls overdue
    stalled = trio.current_time()
    await pacer.wait()
    await pacer.wait()
    assert round(trio.current_time() - stalled, 9) == 0.1  # a new beat, not a burst of 50
