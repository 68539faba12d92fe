"""Actions: ``Actions/Action`` from the config, run by the instance.

Each Action has one or more On modules (when) and one or more Do modules (what). When
an On fires, the Do modules run in file order; a Do that fails is logged and stops the
rest of that run. ``{{NAME}}`` in an option is replaced from the run's variables
(``AMPS_INSTANCE_NAME``, ``AMPS_DATETIME``, ``AMPS_UNIX_TIMESTAMP`` and those of the
event, e.g. ``AMPS_DESTINATION_NAME`` for a downgrade); an unknown name becomes "".

The replication modules implement AMPS's automatic downgrade: ``do-downgrade-
replication`` makes every sync destination whose oldest unacknowledged message is older
than ``Age`` async (persisted acks stop waiting for it at once), after an optional
``GracePeriod`` from startup; ``do-upgrade-replication`` makes such a downgraded
destination sync again once its lag is below its own ``Age`` and it has caught up. With
the upgrade Age well below the downgrade Age (AMPS recommends half), a lag that
oscillates between the two never flips the mode back and forth.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from amps_py import events
from amps_py.config import ActionConfig, ActionModule
from amps_py.schedule import Schedule, parse_every
from amps_py.units import parse_duration

if TYPE_CHECKING:
    from amps_py.server.instance import Instance

log = logging.getLogger("amps_py.actions")

_VAR = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
#: signals an on-signal action may use (INT/TERM stop the instance, QUIT is reserved)
SIGNALS: Mapping[str, int] = {
    "SIGUSR1": signal.SIGUSR1,
    "SIGUSR2": signal.SIGUSR2,
    "SIGHUP": signal.SIGHUP,
}


class ActionFailed(Exception):
    """A Do module could not do its job; the text says why."""


@dataclass
class ActionStatistics:
    index: int
    on: list[str]
    do: list[str]
    runs: int = 0
    failures: int = 0
    last_error: str = ""


def substitute(text: str, variables: Mapping[str, str]) -> str:
    """``{{NAME}}`` replaced from ``variables`` (unknown names become "")."""
    return _VAR.sub(lambda m: variables.get(m.group(1), ""), text)


class ActionRunner:
    """Runs an instance's Actions; ``fire(event)`` runs those with ``On`` that event."""

    def __init__(self, instance: Instance, actions: tuple[ActionConfig, ...]) -> None:
        self.instance = instance
        self.actions = actions
        self.stats = [
            ActionStatistics(
                i + 1,
                [m.module for m in a.on],
                [m.module for m in a.do],
            )
            for i, a in enumerate(actions)
        ]
        self._nursery: trio.Nursery | None = None

    def _with(self, on: str) -> list[int]:
        return [
            i
            for i, action in enumerate(self.actions)
            if any(m.module == f"amps-action-on-{on}" for m in action.on)
        ]

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the schedules and signal handlers, run the startup actions, and run
        the shutdown actions when cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for i, action in enumerate(self.actions):
                    for on in action.on:
                        if on.module == "amps-action-on-schedule":
                            schedule = parse_every(on.options["Every"])
                            nursery.start_soon(self._every, i, schedule)
                        elif on.module == "amps-action-on-signal":
                            nursery.start_soon(self._on_signal, i, on.options["Signal"])
                for i in self._with("startup"):
                    await self._run(i, {})
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                for i in self._with("shutdown"):
                    await self._run(i, {})

    def fire(self, on: str, variables: Mapping[str, str]) -> None:
        """Run (in the background) every action with ``amps-action-on-<on>``."""
        nursery = self._nursery
        if nursery is None:
            return
        for i in self._with(on):
            nursery.start_soon(self._run, i, dict(variables))

    async def _every(self, index: int, schedule: Schedule) -> None:
        started = time.time()
        last = started
        while True:
            due = schedule.next_after(last, started)
            await trio.sleep(max(due - time.time(), 0.0))
            await self._run(index, {})
            # a run that overran its period skips the missed firings instead of piling up
            last = max(due, time.time() if schedule.interval is not None else due)

    async def _on_signal(self, index: int, name: str) -> None:
        with trio.open_signal_receiver(SIGNALS[name]) as signals:
            async for _ in signals:
                await self._run(index, {"AMPS_SIGNAL": name})

    async def _run(self, index: int, event: Mapping[str, str]) -> None:
        action, stats = self.actions[index], self.stats[index]
        now = time.time()
        variables = {
            "AMPS_INSTANCE_NAME": self.instance.name,
            "AMPS_UNIX_TIMESTAMP": str(int(now)),
            "AMPS_DATETIME": datetime.datetime.fromtimestamp(now, datetime.UTC).strftime(
                "%Y%m%dT%H%M%SZ"
            ),
            **event,
        }
        stats.runs += 1
        for do in action.do:
            options = {k: substitute(v, variables) for k, v in do.options.items()}
            try:
                await self._do(do, options)
            except Exception as exc:  # a failing Do stops the rest of this run
                stats.failures += 1
                stats.last_error = f"{do.module}: {exc}"
                log.error(
                    "action %d (config line %d): %s failed: %s; the remaining Do modules "
                    "of this run are skipped",
                    stats.index,
                    action.line,
                    do.module,
                    exc,
                    extra=events.extra(events.ACTION_FAILED),
                )
                return

    async def _do(self, do: ActionModule, options: Mapping[str, str]) -> None:
        module = do.module
        if module == "amps-action-do-downgrade-replication":
            self._downgrade(parse_duration(options["Age"]), options.get("GracePeriod"))
        elif module == "amps-action-do-upgrade-replication":
            self._upgrade(parse_duration(options["Age"]))
        elif module == "amps-action-do-publish-message":
            data = options.get("Data", "")
            self.instance.publish_internal(options["Topic"], data.encode())
        elif module == "amps-action-do-rotate-logs":
            from amps_py.logs import rotate_logs

            rotate_logs()
        elif module == "amps-action-do-shutdown":
            log.warning(
                "action: shutting the instance down",
                extra=events.extra(events.INSTANCE_STOPPING),
            )
            os.kill(os.getpid(), signal.SIGTERM)
        elif module == "amps-action-do-nothing":
            pass
        else:  # pragma: no cover - the config only lets known modules through
            raise ActionFailed(f"no such Do module {module!r}")
        await trio.lowlevel.checkpoint()

    def _downgrade(self, age: float, grace: str | None) -> None:
        instance = self.instance
        if grace and time.time() - instance.started_at < parse_duration(grace):
            return
        manager = instance.replication
        if manager is None:
            return
        for d in manager.destinations:
            if d.config.sync and d.sync:
                behind = d.seconds_behind()
                if behind > age:
                    d.downgrade(
                        f"action: its oldest unacknowledged message is {behind:.1f} s old, "
                        f"over the Age of {age:g} s"
                    )

    def _upgrade(self, age: float) -> None:
        manager = self.instance.replication
        if manager is None:
            return
        for d in manager.destinations:
            if d.config.sync and not d.sync and d.connected and not d.upgrade_pending:
                behind = d.seconds_behind()
                if behind < age:
                    d.upgrade(
                        f"action: its oldest unacknowledged message is {behind:.1f} s old, "
                        f"under the Age of {age:g} s"
                    )

    def statistics(self) -> list[dict[str, Any]]:
        return [s.__dict__.copy() for s in self.stats]
