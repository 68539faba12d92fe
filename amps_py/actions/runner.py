"""The action runner: fires an instance's Actions (On), checks their If modules and
runs their Do modules; see :mod:`amps_py.actions` for what each module does.

The replication Do modules ask :mod:`amps_py.replication.ackmode` which destinations
to downgrade or upgrade, and act on its answer.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from amps_py import events
from amps_py.filters import EvalContext, Filter, FilterError, compile_filter
from amps_py.replication.ackmode import DowngradeRule, KeptSync, UpgradeRule
from amps_py.schedule import Schedule, parse_every
from amps_py.units import parse_duration, parse_percent

if TYPE_CHECKING:
    from amps_py.config import ActionConfig, ActionModule

    from .host import ActionsHost, ClientIdentity

log = logging.getLogger("amps_py.actions")

_VAR = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
#: the journal maintenance each Do module asks the instance for
JOURNAL_MAINTENANCE: Mapping[str, str] = {
    "amps-action-do-archive-journal": "archive",
    "amps-action-do-compress-journal": "compress",
    "amps-action-do-remove-journal": "remove",
}
#: signals an on-signal action may use (INT/TERM stop the instance, QUIT is reserved)
SIGNALS: Mapping[str, int] = {
    "SIGUSR1": signal.SIGUSR1,
    "SIGUSR2": signal.SIGUSR2,
    "SIGHUP": signal.SIGHUP,
}


class ActionFailed(Exception):
    """An If or Do module could not do its job; the text says why."""


@dataclass
class ActionStatistics:
    """What one Action has done: ``runs`` counts firings, ``skipped`` those whose If
    modules did not all hold (no Do ran), ``failures`` those stopped by a failing If or
    Do module."""

    index: int
    on: list[str]
    do: list[str]
    conditions: list[str]
    runs: int = 0
    skipped: int = 0
    failures: int = 0
    last_error: str = ""


def admin_path(path: str) -> str:
    """An ``amps-action-on-admin`` Path in one spelling: no leading or trailing ``/``,
    and without the ``/amps/administrator/actions/`` prefix if given."""
    path = path.strip().strip("/")
    return path.removeprefix("amps/administrator/actions/")


def required_parameters(options: Mapping[str, str]) -> list[str]:
    """The names in an on-admin ``RequiredParameter`` option (comma-separated)."""
    return [p.strip() for p in options.get("RequiredParameter", "").split(",") if p.strip()]


def _listed(text: str) -> set[str]:
    return {part.strip() for part in text.split(",") if part.strip()}


def on_selects(module: ActionModule, on: str, variables: Mapping[str, str]) -> bool:
    """Whether On ``module`` runs for event ``on`` with ``variables``: it is
    ``amps-action-on-<on>``, its ``Topic`` option (when given, as for
    ``amps-action-on-sow-expire-message``) is the event's ``AMPS_TOPIC``, and its
    ``Reason`` option (comma-separated, when given) names one of the event's
    ``AMPS_REASON`` values."""
    if module.module != f"amps-action-on-{on}":
        return False
    topic = module.options.get("Topic")
    if topic and topic != variables.get("AMPS_TOPIC"):
        return False
    wanted = _listed(module.options.get("Reason", ""))
    return not wanted or bool(wanted & _listed(variables.get("AMPS_REASON", "")))


def substitute(text: str, variables: Mapping[str, str]) -> str:
    """``{{NAME}}`` replaced from ``variables`` (unknown names become "")."""
    return _VAR.sub(lambda m: variables.get(m.group(1), ""), text)


@functools.lru_cache(maxsize=256)
def _compiled(condition: str) -> Filter:
    return compile_filter(condition)


def condition_holds(condition: str, context: EvalContext | None = None) -> bool:
    """Whether an ``if-condition`` Condition (variables already substituted) is TRUE.

    The condition is an AMPS filter evaluated against an empty message, so it compares
    literals (``'abc' LIKE '^a'``, ``5 > 3``) and calls functions; a field such as
    ``/x`` is NULL.

    Raises:
        ActionFailed: the text is not a valid filter (e.g. a substituted value broke
            its quoting).
    """
    try:
        return _compiled(condition).matches(None, context)
    except FilterError as exc:
        raise ActionFailed(
            f"Condition {condition!r} is not a valid AMPS filter once its variables are "
            f"substituted: {exc.problem} (column {exc.column})"
        ) from None


def file_system_usage(path: str) -> float:
    """The used share (0..1) of the file system holding ``path``, as ``df`` shows it:
    used / (used + available to unprivileged users).

    Raises:
        ActionFailed: ``path`` cannot be examined.
    """
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        raise ActionFailed(
            f"cannot read the usage of the file system holding {path!r}: {exc}"
        ) from None
    usable = usage.used + usage.free
    return usage.used / usable if usable else 0.0


def client_variables(session: ClientIdentity, *, connected: bool) -> dict[str, str]:
    """The variables of an ``on-connect-client`` (``connected``: before logon), or an
    ``on-logon-client`` / ``on-disconnect-client`` event for ``session``."""
    connection = f"connection-{session.conn_id}"
    variables = {
        # before logon a client has no name yet: AMPS gives the connection name
        "AMPS_CLIENT_NAME": session.client_name or connection,
        "AMPS_CONNECTION_NAME": connection,
        "AMPS_REMOTE_ADDRESS": session.peer,
    }
    if not connected:
        variables["AMPS_AUTHENTICATION_ID"] = session.user_id
    return variables


class ActionRunner:
    """Runs an instance's Actions; ``fire(event)`` runs those with ``On`` that event."""

    def __init__(self, instance: ActionsHost, actions: tuple[ActionConfig, ...]) -> None:
        self.instance = instance
        self.actions = actions
        self.stats = [
            ActionStatistics(
                i + 1,
                [m.module for m in a.on],
                [m.module for m in a.do],
                [m.module for m in a.conditions],
            )
            for i, a in enumerate(actions)
        ]
        self._by_on: dict[str, list[int]] = {}
        for i, action in enumerate(actions):
            for module in dict.fromkeys(m.module for m in action.on):
                self._by_on.setdefault(module.removeprefix("amps-action-on-"), []).append(i)
        self._nursery: trio.Nursery | None = None

    def _with(self, on: str) -> list[int]:
        return self._by_on.get(on, [])

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
        """Run (in the background) every action with ``amps-action-on-<on>`` that
        selects this event (:func:`on_selects`)."""
        nursery = self._nursery
        if nursery is None:
            return
        for i in self._with(on):
            if not any(on_selects(m, on, variables) for m in self.actions[i].on):
                continue
            try:
                nursery.start_soon(self._run, i, dict(variables))
            except RuntimeError:  # the runner is shutting down: too late for new runs
                return

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

    def admin_actions(self) -> list[dict[str, Any]]:
        """The ``amps-action-on-admin`` actions: path, name, description, required
        parameters (``/amps/administrator/actions``)."""
        listed = []
        for i, action in enumerate(self.actions):
            for on in action.on:
                if on.module == "amps-action-on-admin":
                    listed.append(
                        {
                            "path": admin_path(on.options["Path"]),
                            "name": on.options.get("Name", "unknown"),
                            "description": on.options.get("Description", ""),
                            "required_parameters": required_parameters(on.options),
                            "action": i + 1,
                        }
                    )
        return listed

    async def run_admin(self, path: str, parameters: Mapping[str, str]) -> list[dict[str, Any]]:
        """Run, and wait for, every action whose ``amps-action-on-admin`` Path is
        ``path``, with the query ``parameters`` as variables; returns each run's
        outcome (``done``, ``skipped`` or ``failed: ...``).

        Raises:
            KeyError: no action has that Path (the message lists those that exist).
            ValueError: a RequiredParameter is missing (the message names it).
        """
        wanted = admin_path(path)
        matching = [a for a in self.admin_actions() if a["path"] == wanted]
        if not matching:
            known = ", ".join(sorted({a["path"] for a in self.admin_actions()})) or "none"
            raise KeyError(f"no action has amps-action-on-admin Path {wanted!r}; paths: {known}")
        outcomes = []
        for entry in matching:
            missing = [p for p in entry["required_parameters"] if not parameters.get(p)]
            if missing:
                raise ValueError(
                    f"action {entry['name']!r} needs the parameter(s) {', '.join(missing)}; "
                    f"add ?{missing[0]}=... to the URL"
                )
        for entry in matching:
            variables = {"AMPS_ADMIN_PATH": wanted, **parameters}
            outcome = await self._run(entry["action"] - 1, variables)
            outcomes.append({"action": entry["action"], "name": entry["name"], "outcome": outcome})
        return outcomes

    async def _run(self, index: int, event: Mapping[str, str]) -> str:
        """Run action ``index`` once; returns ``done``, ``skipped`` or ``failed: ...``."""
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
        for condition in action.conditions:
            options = {k: substitute(v, variables) for k, v in condition.options.items()}
            try:
                holds = await self._if(condition, options, variables)
            except Exception as exc:  # an If that cannot decide stops the run
                self._failed(index, condition, exc, "the Do modules of this run are skipped")
                return f"failed: {condition.module}: {exc}"
            if not holds:
                stats.skipped += 1
                log.debug(
                    "action %d (config line %d): %s (config line %d) does not hold; its Do "
                    "modules are skipped this time",
                    stats.index,
                    action.line,
                    condition.module,
                    condition.line,
                )
                return "skipped"
        for do in action.do:
            options = {k: substitute(v, variables) for k, v in do.options.items()}
            try:
                await self._do(do, options)
            except Exception as exc:  # a failing Do stops the rest of this run
                self._failed(index, do, exc, "the remaining Do modules of this run are skipped")
                return f"failed: {do.module}: {exc}"
        return "done"

    def _failed(self, index: int, module: ActionModule, exc: Exception, consequence: str) -> None:
        action, stats = self.actions[index], self.stats[index]
        stats.failures += 1
        stats.last_error = f"{module.module}: {exc}"
        log.error(
            "action %d (config line %d): %s failed: %s; %s",
            stats.index,
            action.line,
            module.module,
            exc,
            consequence,
            extra=events.extra(events.ACTION_FAILED),
        )

    async def _if(
        self, condition: ActionModule, options: Mapping[str, str], variables: Mapping[str, str]
    ) -> bool:
        module = condition.module
        if module == "amps-action-if-condition":
            context = EvalContext(
                client_name=variables.get("AMPS_CLIENT_NAME", ""),
                instance_name=self.instance.name,
            )
            return condition_holds(options["Condition"], context)
        if module == "amps-action-if-file-system-usage":
            path = options["Path"]
            used = await trio.to_thread.run_sync(file_system_usage, path)
            above, below = options.get("GreaterThan"), options.get("LessThan")
            holds = (not above or used > parse_percent(above)) and (
                not below or used < parse_percent(below)
            )
            log.debug("file system of %r is %.1f%% used", path, used * 100)
            return holds
        raise ActionFailed(f"no such If module {module!r}")  # pragma: no cover

    async def _do(self, do: ActionModule, options: Mapping[str, str]) -> None:
        module = do.module
        if module == "amps-action-do-downgrade-replication":
            self._downgrade(
                parse_duration(options["Age"]),
                options.get("GracePeriod"),
                int(options.get("MinimumSyncDestinations") or 0),
            )
        elif module == "amps-action-do-upgrade-replication":
            self._upgrade(parse_duration(options["Age"]))
        elif module in JOURNAL_MAINTENANCE:
            await self._maintain_journal(JOURNAL_MAINTENANCE[module], options["Age"])
        elif module in ("amps-action-do-disable-transport", "amps-action-do-enable-transport"):
            name = options["Transport"]
            try:
                if module == "amps-action-do-disable-transport":
                    outcome = self.instance.disable_transport(name)
                else:
                    outcome = await self.instance.enable_transport(name)
            except KeyError as exc:  # says which client transports exist
                raise ActionFailed(str(exc.args[0])) from None
            log.info("action: transport %s: %s", name, outcome)
        elif module in (
            "amps-action-do-enable-proxied-transfer",
            "amps-action-do-disable-proxied-transfer",
        ):
            enable = module == "amps-action-do-enable-proxied-transfer"
            try:
                outcome = self.instance.set_proxied_transfer(options["Topic"], enable)
            except KeyError as exc:  # says which queues exist
                raise ActionFailed(str(exc.args[0])) from None
            log.info("action: %s", outcome)
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

    async def _maintain_journal(self, kind: str, age: str) -> None:
        from amps_py.errors import JournalMaintenanceError

        try:
            result = await self.instance.maintain_journal(kind, older_than=parse_duration(age))
        except JournalMaintenanceError as exc:
            raise ActionFailed(str(exc)) from exc
        log.info("action: %s journal older than %s: %s", kind, age, result.summary)

    def _downgrade(self, age: float, grace: str | None, minimum_sync: int = 0) -> None:
        """Downgrade the sync destinations lagging over ``age``, the most behind first,
        while more than ``minimum_sync`` destinations stay sync (amps-py's
        ``MinimumSyncDestinations`` option: a floor under the number of copies a
        persisted ack waits for; AMPS has no such option, so the default 0 is AMPS's
        behaviour). :class:`DowngradeRule` decides."""
        instance = self.instance
        manager = instance.replication
        if manager is None:
            return
        rule = DowngradeRule(age, parse_duration(grace) if grace else None, minimum_sync)
        destinations = {d.name: d for d in manager.destinations}
        observed = [d.observe() for d in manager.destinations]
        for decision in rule.decide(time.time(), instance.started_at, observed):
            if isinstance(decision, KeptSync):
                log.warning(
                    "action: destination %s lags %.1f s (over the Age of %g s) but stays "
                    "sync: MinimumSyncDestinations is %d",
                    decision.name,
                    decision.behind,
                    age,
                    minimum_sync,
                    extra=events.extra(events.ACTION_FAILED),
                )
            else:
                destinations[decision.name].downgrade(decision.why)

    def _upgrade(self, age: float) -> None:
        """Upgrade the downgraded destinations lagging under ``age``
        (:class:`UpgradeRule` decides)."""
        manager = self.instance.replication
        if manager is None:
            return
        destinations = {d.name: d for d in manager.destinations}
        observed = [d.observe() for d in manager.destinations]
        for decision in UpgradeRule(age).decide(time.time(), observed):
            destinations[decision.name].upgrade(decision.why)

    def statistics(self) -> list[dict[str, Any]]:
        return [s.__dict__.copy() for s in self.stats]
