"""One submitted task seen from the asyncio loop: the path shared by the gRPC servicer and the
OpenAI-compatible HTTP front, so both make tasks and stream their events the same way.

The engine thread hands the task's events to an asyncio queue (`loop.call_soon_threadsafe`). The
caller iterates them until Finished or Failed; when it stops earlier for any reason (its client
went away, a deadline, a cancelled handler), `close()` cancels this task and only this one.
The queue is bounded: when its client has stopped reading and `max_pending` events wait, the task
is cancelled (its slot goes to the next task) and `events()` raises `StreamStalledError`.

A client may name its conversation in the `x-session-id` header (gRPC metadata or HTTP header) so
that a balancer can keep it on one replica, and so on that replica's prompt cache. The server does
not route on it; it only binds it to the task's log lines.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

from hyserve.api.limits import MAX_PENDING_EVENTS
from hyserve.api.validation import PreparedRequest
from hyserve.engine.cancel import CancelSource
from hyserve.engine.engine import Engine
from hyserve.engine.task import Event, FailedEvent, FinishedEvent, Task

__all__ = ["REPLICA_HEADER", "SESSION_HEADER", "StreamStalledError", "TaskRun", "replica_name"]

SESSION_HEADER = "x-session-id"
# initial metadata of every answer: the replica that gave it (a balancer passes it through, so a
# request it redispatched after a refused connection still names the replica that answered)
REPLICA_HEADER = "x-hyserve-replica"


def replica_name(replica_id: str | None) -> str:
    """`--replica-id`, or the hostname: the pod name on Kubernetes, the container id under compose."""
    return replica_id or socket.gethostname()


class StreamStalledError(RuntimeError):
    """The client stopped reading its stream; its task was cancelled (the API answers RESOURCE_EXHAUSTED)."""


class TaskRun:
    def __init__(
        self, engine: Engine, prepared: PreparedRequest, session_id: str = "", max_pending: int = MAX_PENDING_EVENTS
    ) -> None:
        loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._max_pending = max_pending
        self._overflowed = False

        def sink(event: Event) -> None:  # called on the engine thread
            loop.call_soon_threadsafe(self._deliver, event)

        self.engine = engine
        self.task = Task(
            id=prepared.task_id,
            prompt=prepared.prompt,
            params=prepared.params,
            stop=prepared.stop,
            sink=sink,
            logprobs=prepared.logprobs,
            top_logprobs=prepared.top_logprobs,
            cache_prompt=prepared.cache_prompt,
            message_boundaries=prepared.message_boundaries,
            checkpoint_offsets=prepared.checkpoint_offsets,
            grammar=prepared.grammar,
            speculative=prepared.speculative,
            spec_max_draft=prepared.spec_max_draft,
        )
        if session_id:
            self.task.log = self.task.log.bind(session_id=session_id[:128])

    def submit(self) -> None:
        """Queue the task. Raises DuplicateTaskError, QueueFullError or EngineClosedError."""
        self.engine.submit(self.task)

    def _deliver(self, event: Event) -> None:
        """On the loop: queue an event, or drop the backlog and cancel the task once too many wait."""
        if self._overflowed:
            return
        if self._events.qsize() >= self._max_pending:
            self._overflowed = True
            self._events = asyncio.Queue()  # the backlog goes now: the stream ends with an error anyway
            self.task.log.warning("stream_stalled", pending_events=self._max_pending)
            self.engine.cancel_task(self.task, CancelSource.SLOW_READER)
            return
        self._events.put_nowait(event)

    def stall_error(self) -> StreamStalledError:
        return StreamStalledError(
            f"the client did not read its stream: {self._max_pending} events were waiting; the task was cancelled"
        )

    async def events(self) -> AsyncIterator[Event]:
        """The task's events, ending with its FinishedEvent or FailedEvent. Raises StreamStalledError."""
        while True:
            if self._overflowed:
                raise self.stall_error()
            event = await self._events.get()
            yield event
            if isinstance(event, FinishedEvent | FailedEvent):
                return

    def close(self) -> None:
        """The caller is done: cancel the task if it has not ended (no effect on any other task)."""
        if not self.task.ended:
            self.engine.cancel_task(self.task, CancelSource.CLIENT_GONE)
