"""The soak test's clients: random requests with random faults, and what each one saw.

A worker is one thread with its own channel (its own peer, so its Cancels act on its own tasks)
that sends requests one after another until told to stop. Each request has a kind (new, extend,
edit, resend, chat) and maybe a fault (disconnect, deadline, Cancel RPC before or after the task
started); the worker records every event it gets and the status the call ends with.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from enum import Enum

import grpc

from hyserve_client import Accepted, CancelStatus, Delta, Finished, HyserveClient, HyserveError, Message

VOCAB_LO, VOCAB_HI = 10, 400  # plain tokens of the fixture vocabulary
WORDS = "the a cat dog sun moon river stone light dark runs sleeps sings over under near far blue red".split()
NO_FAULT_TIMEOUT_S = 120.0  # a request without a deadline fault that hits this one hung: a lost task


class Kind(Enum):
    NEW = "new"
    EXTEND = "extend"
    EDIT = "edit"
    RESEND = "resend"
    CHAT = "chat"


class Fault(Enum):
    NONE = "none"
    DISCONNECT = "disconnect"  # the client cancels its call after k events
    DEADLINE = "deadline"  # a short deadline on the call
    CANCEL_EARLY = "cancel_early"  # Cancel RPC right after the call starts (queued, or not registered: PENDING)
    CANCEL_LATER = "cancel_later"  # Cancel RPC after k deltas (a running task)


KIND_WEIGHTS = {Kind.NEW: 2, Kind.EXTEND: 3, Kind.EDIT: 2, Kind.RESEND: 1, Kind.CHAT: 2}
FAULT_WEIGHTS = {
    Fault.NONE: 30,
    Fault.DISCONNECT: 18,
    Fault.DEADLINE: 16,
    Fault.CANCEL_EARLY: 18,
    Fault.CANCEL_LATER: 18,
}


@dataclass
class Request:
    kind: Kind
    fault: Fault
    max_tokens: int
    tokens: list[int] | None = None  # token input
    messages: list[Message] | None = None  # chat input
    fault_after: int = 0  # events (disconnect) or deltas (cancel_later) before the fault
    deadline_s: float = 0.0


@dataclass
class Outcome:
    request: Request
    task_id: str
    phase: str
    accepted: list[Accepted] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    events_after_finished: int = 0
    status: grpc.StatusCode | None = None  # the call's error status, if it ended with one
    status_details: str = ""
    disconnected: bool = False  # the client cancelled its own call
    cancel_answers: list[CancelStatus | str] = field(default_factory=list)

    @property
    def finish_reason(self) -> str | None:
        return self.finished[0].reason.value if self.finished else None


class Conversations:
    """A worker's material for follow-up requests: earlier prompts and their completions."""

    def __init__(self) -> None:
        self.token_turns: list[tuple[list[int], list[int]]] = []  # (prompt, completion)
        self.chats: list[tuple[list[Message], str]] = []  # (messages, reply text)

    def remember(self, outcome: Outcome) -> None:
        r = outcome.request
        if r.tokens is not None:
            self.token_turns = [*self.token_turns[-7:], (r.tokens, outcome.tokens)]
        elif r.messages is not None:
            self.chats = [*self.chats[-7:], (r.messages, outcome.text)]


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _fresh(rng: random.Random, lo: int, hi: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(rng.randint(lo, hi))]


def draw_request(rng: random.Random, past: Conversations, max_prompt: int) -> Request:
    """A random request (pure function of the generator's state and the worker's history)."""
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    fault = rng.choices(list(FAULT_WEIGHTS), weights=list(FAULT_WEIGHTS.values()))[0]
    # mostly short completions; some long ones, so that shutdown and cancels meet running tasks
    max_tokens = rng.randint(1, 16) if rng.random() < 0.85 else rng.randint(40, 120)
    req = Request(kind, fault, max_tokens, fault_after=rng.randint(0, 6), deadline_s=rng.uniform(0.005, 0.25))
    turns = past.token_turns
    if kind is Kind.CHAT:
        if past.chats and rng.random() < 0.7:
            messages, reply = rng.choice(past.chats)
            req.messages = [*messages, Message("assistant", reply), Message("user", _words(rng, 1, 12))]
        else:
            req.messages = [Message("user", _words(rng, 1, 20))]
        if len(req.messages) > 9:
            req.messages = req.messages[-3:]
    elif kind is Kind.NEW or not turns:
        req.kind, req.tokens = Kind.NEW, _fresh(rng, 4, 96)
    else:
        prompt, completion = rng.choice(turns)
        if kind is Kind.EXTEND:
            req.tokens = prompt + completion + _fresh(rng, 1, 24)
        elif kind is Kind.EDIT:
            at = rng.randrange(len(prompt))
            req.tokens = prompt[:at] + _fresh(rng, 1, 16) + (prompt[at + 1 :] if rng.random() < 0.5 else [])
        else:
            req.tokens = list(prompt)
        if len(req.tokens) > max_prompt:
            req.kind, req.tokens = Kind.NEW, req.tokens[-(max_prompt // 2) :]
    return req


class Worker(threading.Thread):
    def __init__(self, index: int, target: str, seed: int, stop: threading.Event, phase: str, max_prompt: int) -> None:
        super().__init__(name=f"soak-{index}", daemon=True)
        self.index = index
        self.target = target
        self.rng = random.Random(seed)
        self.stop = stop
        self.phase = phase
        self.max_prompt = max_prompt
        self.past = Conversations()
        self.outcomes: list[Outcome] = []
        self.error: BaseException | None = None
        self._n = 0
        self.client = HyserveClient(target, timeout=NO_FAULT_TIMEOUT_S)  # closed by the test

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                outcome = self.one(self.client, draw_request(self.rng, self.past, self.max_prompt))
                self.outcomes.append(outcome)
                if outcome.finished and outcome.finish_reason != "cancelled" and outcome.status is None:
                    self.past.remember(outcome)
                if outcome.status is grpc.StatusCode.UNAVAILABLE:
                    time.sleep(0.2)  # the server is draining or restarting
        except BaseException as exc:  # reported by the test
            self.error = exc

    def still_live(self) -> list[str]:
        """After the server went idle: the ids of this worker's tasks that a Cancel still finds
        live (lost tasks: registered, never ended). Sent on the worker's own channel (its peer)."""
        # PENDING: the id never registered (its Generate was refused); ALREADY_FINISHED: it ended
        answers = {out.task_id: self.client.cancel(out.task_id, timeout=10) for out in self.outcomes}
        return [task_id for task_id, answer in answers.items() if answer is CancelStatus.CANCELLED]

    def one(self, client: HyserveClient, req: Request) -> Outcome:
        self._n += 1
        task_id = f"w{self.index}-{self.phase}-{self._n}"
        out = Outcome(req, task_id, self.phase)
        timeout = req.deadline_s if req.fault is Fault.DEADLINE else NO_FAULT_TIMEOUT_S
        params = {"task_id": task_id, "max_tokens": req.max_tokens, "ignore_eos": True, "timeout": timeout}
        try:
            if req.tokens is not None:
                stream = client.generate(token_ids=req.tokens, **params)  # type: ignore[arg-type]
            else:
                stream = client.generate(messages=req.messages, **params)  # type: ignore[arg-type]
            if req.fault is Fault.CANCEL_EARLY:
                self._cancel(client, out)
            events = 0
            for event in stream:
                events += 1
                if out.finished:
                    out.events_after_finished += 1
                if isinstance(event, Accepted):
                    out.accepted.append(event)
                elif isinstance(event, Delta):
                    out.tokens += event.token_ids
                    out.text += event.text
                    due = len(out.tokens) >= req.fault_after and not out.cancel_answers
                    if req.fault is Fault.CANCEL_LATER and due:
                        self._cancel(client, out)
                elif isinstance(event, Finished):
                    out.finished.append(event)
                if req.fault is Fault.DISCONNECT and events >= req.fault_after and not out.finished:
                    stream.cancel()
                    out.disconnected = True
                    break
            if req.fault is Fault.CANCEL_LATER and not out.cancel_answers:
                self._cancel(client, out)  # it ended first: the Cancel must say so
        except HyserveError as exc:
            out.status, out.status_details = exc.code, exc.details
        return out

    def _cancel(self, client: HyserveClient, out: Outcome) -> None:
        """Cancel by id, once: right after the call started the answer may be PENDING (the Generate
        has not registered yet; the server applies the cancel when it does)."""
        try:
            answer: CancelStatus | str = client.cancel(out.task_id, timeout=10)
        except HyserveError as exc:  # NOT_FOUND while the server drains
            answer = exc.code.name
        out.cancel_answers.append(answer)
