"""The hand-over to taskiq's receiver: what it may get now, and what its acks become.

Entries delivered to this worker wait here by priority. taskiq pulls them one at a time
(``admit``) while the lease is known to be held; a *suspect* (an entry started twice without
an outcome: its workers died) is handed over only once nothing else is in taskiq's hands,
and nothing else until it is acknowledged, so a task that kills its worker takes no innocent
neighbour with it. An entry past ``max_deliveries``, or one that cannot run (not an
envelope, not a taskiq message), goes to the dead letters instead.

The middleware reports when taskiq really starts a message (``begin``: the start of a
reclaimed entry is counted then) and when it failed without a retry (``failed``); taskiq's
ack (``ack``) becomes the settle instruction: success, failure or dead letter. An ack of a
message that never started is a dead letter when taskiq's receiver skipped it (it cannot
parse it, or knows no task by its name), and done when code reading ``listen()`` itself
handled it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...base._errors import TetherError
from ...base._faults import Fault, classify
from ...protocol import scripts
from ...protocol._envelope import BadEnvelope, Envelope, JsonSerializer
from ...protocol._keys import derived_task_id
from ...worker import kit as policy
from ._delivery import TaskiqDelivery
from ._wire import NotTaskiq, unwrap

if TYPE_CHECKING:
    from ...base._redis import AsyncClient
    from ...worker.kit import Delivery, Ledger, WorkerCounters

log = logging.getLogger("tether.taskiq")


class DeliveryLost(TetherError):
    """Raised before a reclaimed message runs when this worker no longer owns its entry
    (its lease lapsed and another worker took it): taskiq must not run it here too."""


def unknown_task(name: str) -> str:
    return f"unknown task {name!r}: this taskiq worker has no task by that name"


class Handover:
    def __init__(
        self,
        *,
        client: AsyncClient,
        consumer: str,
        ledger: Ledger,
        counters: WorkerCounters,
        settle: Callable[[Delivery, policy.Outcome], None],
        wake: Callable[[], None],
        find_task: Callable[[str], object | None],
        read_task_id: Callable[[bytes], str | None],
        max_deliveries: int,
        result_ttl_ms: int,
        counts_starts: bool,
        dead_letter_failures: bool,
    ) -> None:
        self._client = client
        self.name = consumer
        self.ledger = ledger
        self.counters = counters
        self._settle = settle
        self._wake = wake
        self._find_task = find_task
        self._read_task_id = read_task_id
        """The task id taskiq's receiver reads in a message's bytes (None: unreadable)."""
        self._max_deliveries = max_deliveries
        self._ttl_ms = result_ttl_ms
        self._counts_starts = counts_starts
        """The middleware counts a reclaimed entry's start when taskiq really starts it; without
        it the start is counted when the entry is handed to taskiq."""
        self._dead_letter_failures = dead_letter_failures
        self._serializer = JsonSerializer()
        self.waiting: policy.Waiting[TaskiqDelivery] = policy.Waiting()
        """What waits for taskiq (suspects are handed over alone)."""
        self.busy = 0
        """Entries handed to taskiq and not yet acknowledged."""
        self._handed: dict[str, deque[TaskiqDelivery]] = {}
        """Handed to taskiq and not yet started, by taskiq task id."""
        self.started = 0
        """Entries whose task taskiq started (the middleware says so) and has not acknowledged."""

    # -- waiting here -------------------------------------------------------------------

    def submit(self, d: Delivery) -> None:
        """The engine delivered an entry: it waits here until taskiq pulls it."""
        assert isinstance(d, TaskiqDelivery)
        d.consumer = self.name
        self.waiting.add(d)
        self._wake()

    def take_buffered(self) -> list[TaskiqDelivery]:
        return self.waiting.take_all()

    def resume(self) -> None:
        """The lease is known to be held again: the puller may take what waits."""
        self._wake()

    def request_cancel(self, task_ids: set[str]) -> None:
        """Tether cancel requests for tasks here: taskiq cannot cancel a running task."""
        log.warning(
            "cancel requested for %s: a running taskiq task cannot be cancelled by Tether; "
            "it runs to the end",
            ", ".join(sorted(task_ids)),
        )

    async def wait_idle(self, timeout: float) -> bool:
        """taskiq's receiver waits for its own tasks before it closes the broker."""
        return True

    def cancel_running(self) -> list[TaskiqDelivery]:
        """Nothing to cancel: taskiq runs (and finishes) what it was handed."""
        return []

    def close(self) -> None:
        """Nothing of its own to free."""

    # -- handing over -------------------------------------------------------------------

    def pick(self, lease_held: bool) -> TaskiqDelivery | None:
        """What may be handed over now: nothing while the lease is in doubt; else what
        ``Waiting.next`` gives (a suspect alone, once nothing is in taskiq's hands)."""
        return self.waiting.next(self.busy) if lease_held else None

    async def admit(self, d: TaskiqDelivery) -> bytes | None:
        """taskiq's bytes of a delivery that may run; None when it went to the dead letters
        or is no longer this worker's."""
        try:
            data = await self._admit(d)
        finally:
            if not d.yielded:
                self.waiting.ended(d)
        return data

    async def _admit(self, d: TaskiqDelivery) -> bytes | None:
        reason = policy.quarantine_reason(d, self._max_deliveries)
        if reason is not None:
            self.counters.quarantined += 1
            log.error("quarantined entry %s: %s", d.entry_id.decode(), reason)
            self._dead(d, self._peek(d), reason)
            return None
        try:
            env = Envelope.decode(d.payload, self._serializer)
        except BadEnvelope as bad:
            log.error("entry %s cannot be run: %s", d.entry_id.decode(), bad.reason)
            self._dead(d, None, bad.reason, bad.task_id)
            return None
        self._bind(d, env)
        try:
            data, taskiq_id = unwrap(env)
        except NotTaskiq as exc:
            log.error("entry %s cannot be run: %s", d.entry_id.decode(), exc)
            self._dead(d, env, str(exc))
            return None
        if not self._counts_starts and self._find_task(env.task) is None:
            # Without the middleware an ack cannot tell a run from a message taskiq's
            # receiver dropped (an unknown name is acknowledged unrun): refuse it here. With
            # it, the message is handed over as taskiq-redis hands over any name (to code
            # that reads listen() itself too), and its unrun ack dead-letters it.
            reason = unknown_task(env.task)
            log.error("entry %s cannot be run: %s", d.entry_id.decode(), reason)
            self._dead(d, env, reason)
            return None
        if d.suspect and not self._counts_starts and not await self._count_start(d):
            return None
        d.taskiq_id = taskiq_id
        d.yielded = True
        self.busy += 1
        if self._counts_starts:
            self._handed.setdefault(taskiq_id, deque()).append(d)
        return data

    def _bind(self, d: TaskiqDelivery, env: Envelope) -> None:
        bound = bool(env.id)
        if not bound:  # a plain kick: the stream entry is the task's identity
            env.id = derived_task_id(d.queue.name, d.sidx, d.entry_id.decode())
        d.envelope = env
        d.target = policy.Target.of(d.queue.keys, env, bound, False, self._ttl_ms)

    def _peek(self, d: TaskiqDelivery) -> Envelope | None:
        try:
            env = Envelope.decode(d.payload, self._serializer)
        except BadEnvelope:
            return None
        self._bind(d, env)
        return env

    async def _count_start(self, d: TaskiqDelivery) -> bool:
        """Count a start of a reclaimed entry; False (and the entry forgotten here) when this
        worker no longer owns it or cannot tell right now."""
        entry = d.entry_id.decode()
        try:
            count = await scripts.start(d.stream, self.name, d.entry_id).run(self._client)
        except Exception as exc:
            fault = classify(exc)
            if fault is Fault.INTERNAL:
                raise
            self.ledger.release([d])
            if fault is Fault.LOST:
                log.warning("entry %s was lost with its stream (%s)", entry, exc)
            else:  # a fault no retry fixes stops the consumer through its fetch loop
                log.warning("could not start entry %s (%s); it is taken up again later", entry, exc)
                self.ledger.resync = True
            return False
        if count == 0:
            log.warning("entry %s changed owner before it started", entry)
            self.ledger.release([d])
            return False
        d.deliveries, d.counted = count, True
        return True

    # -- what the middleware reports ----------------------------------------------------

    async def begin(self, taskiq_id: str) -> TaskiqDelivery | None:
        """taskiq is about to run the message with this id: count the start of a reclaimed
        entry. Raises :class:`DeliveryLost` when it must not run here."""
        handed = self._handed.get(taskiq_id)
        if not handed:
            return None
        d = handed.popleft()
        if not handed:
            del self._handed[taskiq_id]
        d.started = True
        self.started += 1
        if d.suspect and not await self._count_start(d):
            self._out_of_hands(d)
            self._wake()
            raise DeliveryLost(
                f"entry {d.entry_id.decode()} of {d.stream} is no longer this worker's "
                "(its lease lapsed and another worker took it, or the server is unreachable): "
                "taskiq does not run it here"
            )
        return d

    def failed(self, d: TaskiqDelivery, exc: BaseException, retried: bool) -> None:
        """The task raised; ``retried`` when taskiq's retry middleware took it again."""
        if retried or d.rekicked:
            d.retried = True
            self.counters.retried += 1
            return
        err = policy.error_fields(exc)
        d.failure = (err, f"failed and taskiq did not retry it: {err['type']}: {err['message']}")

    def ack(self, d: TaskiqDelivery) -> None:
        """taskiq acknowledged the message: settle it (fenced, batched)."""
        if d.acked:
            return
        d.acked = True
        self._out_of_hands(d)
        self._settle(d, self._outcome(d))
        self._wake()

    def _out_of_hands(self, d: TaskiqDelivery) -> None:
        """The delivery is out of taskiq's hands."""
        self.busy -= 1
        self.waiting.ended(d)
        if d.started:
            self.started -= 1
        else:
            handed = self._handed.get(d.taskiq_id)
            if handed is not None and d in handed:
                handed.remove(d)
                if not handed:
                    del self._handed[d.taskiq_id]

    def _outcome(self, d: TaskiqDelivery) -> policy.Outcome:
        env, target = d.envelope, d.target
        assert env is not None
        assert target is not None
        if self._counts_starts and not d.started:
            reason = self._unrun_reason(d)
            if reason is not None:
                log.error("entry %s: %s", d.entry_id.decode(), reason)
                self.counters.dead_lettered += 1
                return policy.dead(target, self._serializer, env, reason)
        if d.failure is not None:
            self.counters.failed += 1
            if self._dead_letter_failures:
                error, reason = d.failure
                self.counters.dead_lettered += 1
                return policy.failure(target, self._serializer, env, error, reason)
        elif not d.retried:  # a retried attempt was counted as such
            self.counters.succeeded += 1
        return policy.success(target, self._serializer, env, None)

    def _unrun_reason(self, d: TaskiqDelivery) -> str | None:
        """Why an ack the middleware never saw start dead-letters its message; None when
        it is done. taskiq's receiver acknowledges unrun a message it cannot read and one
        whose task it does not know; code that reads ``broker.listen()`` itself (no
        receiver, so no middleware) acknowledges what it handled. Only the last holds a
        message whose bytes read back to its own task id and a known task. That costs a
        parse, on this path alone."""
        env = d.envelope
        assert env is not None
        try:
            data, taskiq_id = unwrap(env)
        except NotTaskiq:  # admitted only as a taskiq message: not reached
            return "acknowledged without running it: it is not a taskiq message"
        if self._read_task_id(data) != taskiq_id:
            # A message whose task id differs from its envelope's is no message this
            # broker kicked either.
            return (
                "taskiq's receiver acknowledged it without running it: it could not parse "
                "the message (see the worker's log), or the message's task id is not the "
                "one its envelope names"
            )
        if self._find_task(env.task) is None:
            return unknown_task(env.task) + "; it was acknowledged without being run"
        return None

    def _dead(
        self, d: TaskiqDelivery, env: Envelope | None, reason: str, task_id: str = ""
    ) -> None:
        self.counters.dead_lettered += 1
        if env is None or d.target is None:
            fallback = task_id or derived_task_id(d.queue.name, d.sidx, d.entry_id.decode())
            outcome = policy.dead(None, self._serializer, None, reason, fallback)
        else:
            outcome = policy.dead(d.target, self._serializer, env, reason)
        self._settle(d, outcome)
