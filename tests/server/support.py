"""What the server tests share: the prompts and their greedy references from the in-process generator,
the server process's handle, and small helpers over the client."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hyserve_client import Accepted, Delta, Event, Finished, HyserveClient, HyserveError, Message, SlotState

REPO = Path(__file__).resolve().parents[2]  # the repository root
SERVICE = "hyserve.v1.HyserveService"
CTX = 512
QUEUE = 2
START_TIMEOUT_S = 180

PROMPT_A = "The capital of France is"
PROMPT_B = "Once upon a time"
PROMPT_LONG = (
    "Here is a short story about a lighthouse keeper who lived alone on a rocky island far from the coast. "
    "Every night he climbed the stairs to light the lamp, and every morning he wrote a line in his logbook."
)
N_A, N_B, N_LONG = 24, 8, 8

# Gemma-style turns; refuses conversations whose roles do not alternate (like many real templates)
CHAT_TEMPLATE = """{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}
{{ m['content'] }}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""
CHAT = [Message("user", "Hi")]


@dataclass(frozen=True)
class Ref:
    tokens: list[int]
    text: str
    prompt_tokens: int


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    target: str
    log_path: Path
    refs: dict[str, Ref]

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def _references(template_file: Path) -> dict[str, Ref]:
    """Greedy completions from the in-process generator (fresh memory, no cache, no batching)."""
    from hyserve.engine.generator import StopRule, generate
    from hyserve.engine.sampling import SamplingParams
    from hyserve.model.loader import load_model

    model = load_model("default", template_file)
    tok = model.tokenizer

    def run(prompt: list[int], n: int, model: Any = model) -> Ref:
        items = list(generate(model, prompt, SamplingParams(), StopRule(max_tokens=n), n_ctx=CTX))
        return Ref([i.token_id for i in items], "".join(i.text for i in items), len(prompt))

    chat_text = model.chat_template.render([{"role": "user", "content": "Hi"}]).text
    refs = {
        "A": run(tok.encode(PROMPT_A), N_A),
        "B": run(tok.encode(PROMPT_B), N_B),
        "LONG": run(tok.encode(PROMPT_LONG), N_LONG),
        "CHAT": run(tok.encode(chat_text, add_special=False, parse_special=True), 4),
    }
    del model
    return refs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def tokens_of(events: list[Event]) -> list[int]:
    return [t for e in events if isinstance(e, Delta) for t in e.token_ids]


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Delta))


class Background:
    """Runs one Generate call to its end on a thread; keeps its events or its error."""

    def __init__(self, client: HyserveClient, text: str, **params: Any) -> None:
        self.events: list[Event] = []
        self.error: HyserveError | None = None
        self.accepted = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, text, params), daemon=True)
        self._thread.start()

    def _run(self, client: HyserveClient, text: str, params: dict[str, Any]) -> None:
        try:
            for event in client.generate(text, **params):
                self.events.append(event)
                if isinstance(event, Accepted):
                    self.accepted.set()
        except HyserveError as exc:
            self.error = exc

    def join(self, timeout: float = 120) -> Background:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the Generate call did not end"
        return self

    @property
    def finished(self) -> Finished:
        assert self.error is None, self.error
        last = self.events[-1]
        assert isinstance(last, Finished), self.events
        return last


def start_active(client: HyserveClient, text: str, task_id: str, max_tokens: int) -> tuple[Any, list[Event]]:
    """Start a task and read until its first Delta: it is then the running task."""
    stream = client.generate(text, task_id=task_id, max_tokens=max_tokens)
    events: list[Event] = []
    for event in stream:
        events.append(event)
        if isinstance(event, Delta) and event.token_ids:
            break
    assert isinstance(events[0], Accepted)
    return stream, events


def wait_logged(server: Server, event: str, task_id: str, timeout: float = 30) -> None:
    """Wait until the server has logged `event` for `task_id` (e.g. task_queued)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in server.log_path.read_text(errors="replace").splitlines():
            if f'"event": "{event}"' in line and f'"task_id": "{task_id}"' in line:
                return
        assert time.monotonic() < deadline, f"the server never logged {event} for {task_id}"
        time.sleep(0.02)


def wait_idle(client: HyserveClient, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while client.cache_stats().slots[0].state is not SlotState.IDLE:
        assert time.monotonic() < deadline, "slot did not become idle"
        time.sleep(0.05)
