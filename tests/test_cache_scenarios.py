"""Prompt-cache scenarios through the real gRPC service, with exact counts of processed prompt tokens.

One real server per memory kind, all on `--parallel 1`: a hybrid model (tiny `qwen35`), a purely
recurrent one (tiny `mamba2`), an attention-only one (tiny `llama`) and a sliding-window one
(Gemma 3 270M, the default model). Every tiny model uses the fixture chat template, which drops
the reasoning of assistant turns before the last user message, as Qwen3.5's does; Gemma gets the
same template through --chat-template.

The expected count is computed from tokens, not from the server: a `Ledger` tokenizes each
request in-process (the same template and tokenizer code the server runs) and records every
sequence the server has evaluated; the minimum for a prompt is its length minus its longest
common prefix with any of them, 0 for an identical resend of an earlier prompt. Every completed
request is also compared with a cache-free in-process generation (I4).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest
from cache_ledger import Ledger
from fixtures import make_models
from prometheus_client.parser import text_string_to_metric_families
from server_process import free_port, running_server

from hyserve.engine.cache_plan import common_prefix_len
from hyserve.engine.generator import StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.model.backend.select import DeviceRequest
from hyserve.model.loader import LoadedModel, load_model
from hyserve_client import Accepted, Delta, Finished, FinishReason, HyserveClient, HyserveError

GEN = 3  # completion tokens per request: short, the prompts are what matters here
ACTIVE_GEN = 200  # scenario (g): the active task generates while another waits and is cancelled

SYSTEM = "You are a careful assistant. Answer briefly and cite the tool output when you use it."
USERS = [
    "List the files in the project directory.",
    "Open the README and summarise the first section.",
    "Now count the lines of every Python module.",
    "Which module is the longest, and why?",
]
REPLIES = ["I will call the list tool.", "The README explains setup.", "Counting now.", "engine.py is longest."]


class Served(Ledger):
    """A running server of one memory kind, with the ledger of what it has evaluated."""

    def __init__(self, kind: str, target: str, model: LoadedModel, metrics_url: str) -> None:
        super().__init__(model)
        self.kind, self.target, self.metrics_url = kind, target, metrics_url

    def reference(self, prompt: list[int], n: int = GEN) -> list[int]:
        stop = StopRule(max_tokens=n, ignore_eos=True)
        return [g.token_id for g in generate(self.model, prompt, SamplingParams(), stop)]

    def ask(
        self, messages: Sequence[dict[str, Any]], expected: int | None = None, **kwargs: Any
    ) -> tuple[Accepted, list[int], Finished]:
        """One greedy request; checks the processed count (default: the minimum) and the answer (I4)."""
        prompt = self.tokens(messages)
        if expected is None:
            expected = self.minimum(prompt)
        accepted, generated, finished = run(self.target, messages=messages, **kwargs)
        assert accepted.prompt_tokens == len(prompt)
        assert finished.usage.processed_prompt_tokens == expected, (self.kind, accepted)
        assert accepted.reused_tokens == len(prompt) - expected
        assert generated == self.reference(prompt), "the cache changed an answer (I4)"
        self.record(prompt, generated)
        return accepted, generated, finished


def run(target: str, n: int = GEN, **kwargs: Any) -> tuple[Accepted, list[int], Finished]:
    with HyserveClient(target) as client:
        events = list(client.generate(max_tokens=n, ignore_eos=True, **kwargs))
    assert isinstance(events[0], Accepted) and isinstance(events[-1], Finished)
    return events[0], [t for e in events if isinstance(e, Delta) for t in e.token_ids], events[-1]


def chat(n_turns: int, *, system: str = SYSTEM, users: Sequence[str] = USERS) -> list[dict[str, Any]]:
    """A conversation of n_turns user messages with the scripted assistant replies between them."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for i in range(n_turns):
        if i:
            messages.append({"role": "assistant", "content": REPLIES[i - 1], "reasoning_content": f"Step {i}."})
        messages.append({"role": "user", "content": users[i]})
    return messages


# "-gpu": the same server on the wgpu device (a software adapter where no GPU exists)
KINDS = ["qwen35", "mamba2", "llama", "gemma3", "gemma3-ring", "llama-gpu", "qwen35-gpu"]


@pytest.fixture(scope="module", params=KINDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    kind = request.param
    arch = kind.removesuffix("-gpu")
    device = "gpu" if kind.endswith("-gpu") else "cpu"
    tmp = tmp_path_factory.mktemp(f"cache-{kind}")
    template = tmp / "template.jinja"
    template.write_text(make_models.CHAT_TEMPLATE)
    if kind.startswith("gemma3"):
        model_arg = "default"
    else:
        model_arg = str(make_models.write_model(tmp / f"{arch}.gguf", arch, qtype="q8_0"))
    args = ["--model", model_arg, "--chat-template", str(template), "--parallel", "1", "--ctx-size", "2048"]
    if kind == "gemma3-ring":  # sliding-window layers as ring buffers, resumed from window checkpoints
        args += ["--swa-cache", "ring"]
    metrics_port = free_port()
    args += ["--threads", "2", "--prompt-chunk", "32", "--checkpoint-interval", "64"]
    args += ["--metrics-port", str(metrics_port), "--device", device]
    model = load_model(model_arg, template, DeviceRequest(device))  # the cache-free reference runs on the same device
    with running_server(tmp / "server.log", *args) as target:
        yield Served(kind, target, model, f"http://127.0.0.1:{metrics_port}/metrics")


def stats(target: str) -> Any:
    with HyserveClient(target) as client:
        return client.cache_stats()


def test_model_info_names_the_device_and_its_numerics(served: Served) -> None:
    with HyserveClient(served.target) as client:
        info = client.model_info()
    on_gpu = served.kind.endswith("-gpu")
    assert (info.device, info.gpu_numerics) == (("gpu", "fast") if on_gpu else ("cpu", ""))


# --- the scenarios -------------------------------------------------------------------------------


def test_a_agent_loop_processes_only_the_new_tokens(served: Served) -> None:
    for turn in range(1, 4):
        accepted, _, finished = served.ask(chat(turn))
        if turn > 1:
            assert accepted.reused_tokens > 0 and finished.usage.processed_prompt_tokens < accepted.prompt_tokens
    # a tool loop: the assistant's reasoning stays (it follows the last user message), the tool
    # result and the next generation prompt are the only new tokens
    messages = [
        *chat(3),
        {"role": "assistant", "content": "<tool_call>wc -l</tool_call>", "reasoning_content": "Count them."},
        {"role": "tool", "content": "engine.py 640\nserver.py 240"},
    ]
    served.ask(messages)
    # the live state continues a pure extension (token input: the prompt + the answer + more)
    prompt = served.tokens(chat(1, system="Plain continuation test."))
    _, first, _ = run(served.target, token_ids=prompt)
    served.record(prompt, first)
    extended = [*prompt, *first, *prompt[1:9]]
    accepted, _, finished = run(served.target, token_ids=extended)
    assert accepted.reused_tokens == len(prompt) + len(first) - 1
    assert finished.usage.processed_prompt_tokens == len(extended) - accepted.reused_tokens


def test_b_a_template_that_drops_reasoning_resumes_where_the_prompts_diverge(served: Served) -> None:
    system = "Think step by step before answering."
    served.ask(chat(1, system=system))
    # turn 2 renders turn 1's assistant message without its reasoning: the prompts part inside
    # turn 1's generation prompt ("<|im_start|>assistant\n<think>\n"), right at the message
    messages = chat(2, system=system)
    prompt = served.tokens(messages)
    previous = served.prompts[-1]
    diverge = common_prefix_len(prompt, previous)
    assert len(previous) - 8 < diverge < len(previous), "the divergence lies in the generation prompt"
    accepted, _, _ = served.ask(messages)
    assert accepted.reused_tokens == diverge
    # a tool loop keeps the reasoning of its assistant turns (they follow the last user message);
    # the next user message drops all of it: the prompts part at the loop's first "<think>"
    loop = [
        {"role": "system", "content": system},
        {"role": "user", "content": USERS[2]},
        {"role": "assistant", "content": "<tool_call>ls</tool_call>", "reasoning_content": "List first."},
        {"role": "tool", "content": "a.py b.py"},
    ]
    served.ask(loop)
    after = [*loop, {"role": "assistant", "content": "Two files.", "reasoning_content": "Done."}]
    after.append({"role": "user", "content": USERS[3]})
    diverge = common_prefix_len(served.tokens(after), served.tokens(loop))
    accepted, _, _ = served.ask(after)
    assert accepted.reused_tokens == diverge < len(served.tokens(loop)) - 8


def test_c_an_edited_last_user_message_resumes_at_that_message(served: Served) -> None:
    served.ask(chat(3))
    edited = chat(3, users=[*USERS[:2], "Forget that; instead show the git log."])
    # the prompts part where the last user message's content starts (its header is unchanged)
    diverge = common_prefix_len(served.tokens(chat(3)), served.tokens(edited))
    accepted, _, _ = served.ask(edited)
    assert accepted.reused_tokens == diverge and accepted.reuse_source.name != "NONE"


def test_d_an_identical_resend_evaluates_nothing(served: Served) -> None:
    messages = chat(2, system="Identical resend test.")
    served.ask(messages)
    accepted, _, finished = served.ask(messages)
    assert finished.usage.processed_prompt_tokens == 0 and accepted.reused_tokens == accepted.prompt_tokens


def test_e_two_conversations_alternating_on_one_slot_process_only_new_tokens(served: Served) -> None:
    # different system messages (test_i: system prompts that part inside their text)
    a = "Zebra persona: plan trips."
    b = "Quokka persona: review code."
    for turn in range(1, 4):
        served.ask(chat(turn, system=a))
        accepted, _, _ = served.ask(chat(turn, system=b))
        if turn > 1:
            assert accepted.reuse_source.name in ("PREFIX_STORE", "CHECKPOINT", "SLOT_LIVE")
    counters = stats(served.target).counters
    assert counters.prefix_store_hits >= 4


def test_f_cancel_during_a_long_prompt_then_resend_processes_only_the_rest(served: Served) -> None:
    long_text = " ".join(f"item {i}: the value is {i * 7 % 13}." for i in range(75))
    messages = [{"role": "user", "content": long_text}]
    prompt = served.tokens(messages)
    with HyserveClient(served.target) as client:
        stream = client.generate(messages=messages, max_tokens=GEN, ignore_eos=True, task_id=f"long-{served.kind}")
        events = iter(stream)
        accepted = next(events)
        assert isinstance(accepted, Accepted)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # cancel once the task's first chunks are committed
            slot = stats(served.target).slots[0]
            if slot.task_id == f"long-{served.kind}" and slot.cached_tokens > accepted.reused_tokens:
                break
            time.sleep(0.001)
        client.cancel(f"long-{served.kind}")
        rest = list(events)
    finished = rest[-1]
    assert isinstance(finished, Finished) and finished.reason is FinishReason.CANCELLED
    done = accepted.reused_tokens + finished.usage.processed_prompt_tokens
    assert accepted.reused_tokens < done < len(prompt), "the cancel landed during prompt processing"
    [slot] = stats(served.target).slots
    assert slot.cached_tokens == done  # the committed chunks stay (I1)
    served.evaluated.append(prompt[:done])
    served.ask(messages, expected=len(prompt) - done)


def test_g_a_cancelled_queued_task_changes_nothing_for_the_active_one(served: Served) -> None:
    messages = [{"role": "user", "content": " ".join(f"row {i} holds {i * i % 17}." for i in range(50))}]
    prompt = served.tokens(messages)
    expected_processed = served.minimum(prompt)
    results: dict[str, Any] = {}

    def active() -> None:  # long enough to be running while the other task waits
        results["active"] = run(served.target, ACTIVE_GEN, messages=messages, task_id=f"active-{served.kind}")

    before = stats(served.target).counters
    worker = threading.Thread(target=active)
    worker.start()
    with HyserveClient(served.target) as client:
        deadline = time.monotonic() + 60
        while stats(served.target).slots[0].task_id != f"active-{served.kind}" and time.monotonic() < deadline:
            time.sleep(0.005)
        queued = client.generate(messages=chat(1), max_tokens=GEN, task_id=f"queued-{served.kind}")
        queued_events: list[Any] = []
        reader = threading.Thread(target=lambda: queued_events.extend(queued))
        reader.start()
        deadline = time.monotonic() + 30
        while True:  # the Generate call may not have reached the server yet
            try:
                client.cancel(f"queued-{served.kind}")
                break
            except HyserveError as exc:
                if exc.code is not grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                    raise
                time.sleep(0.002)
        reader.join(60)
    worker.join(120)
    _, generated, finished = results["active"]
    assert finished.reason is FinishReason.MAX_TOKENS
    assert finished.usage.processed_prompt_tokens == expected_processed
    assert generated == served.reference(prompt, ACTIVE_GEN)
    assert [type(e) for e in queued_events] == [Finished] and queued_events[0].reason is FinishReason.CANCELLED
    after = stats(served.target).counters
    assert after.prompt_tokens_received - before.prompt_tokens_received == len(prompt)  # the queued one never ran
    served.record(prompt, generated)


# --- prompts that part inside a message: exact on every memory kind (kept inputs, replays) ----------


def ask_tokens(served: Served, prompt: list[int], n: int = GEN) -> tuple[Accepted, list[int], Finished]:
    """A token-input request that must process exactly the minimum and answer as a cache-free run."""
    expected = served.minimum(prompt)
    accepted, generated, finished = run(served.target, n, token_ids=prompt)
    assert finished.usage.processed_prompt_tokens == expected, (served.kind, accepted, expected)
    assert accepted.reused_tokens == len(prompt) - expected
    assert generated == served.reference(prompt, n), "the cache changed an answer (I4)"
    served.record(prompt, generated)
    return accepted, generated, finished


def long_user(served: Served) -> str:
    """A user message; for the ring window cache long enough (~700 tokens) that the ring no longer
    holds what its first words saw (the full cache reaches everything anyway: shorter, faster)."""
    steps = 60 if served.kind == "gemma3-ring" else 12
    return " ".join(f"Step {i}: open file_{i}.py and count its lines." for i in range(steps))


def test_h_an_edit_that_keeps_the_first_words_of_the_last_user_message(served: Served) -> None:
    system = "Edit persona: answer in one line."
    text = long_user(served)
    served.ask(chat(3, system=system, users=[*USERS[:2], text]))
    words = text.split()
    kept = " ".join(words[: len(words) * 2 // 5])  # the first 40 % of the words, then a new ending
    for ending in (" Then stop and report.", " Skip the tests folder, please."):
        edited = chat(3, system=system, users=[*USERS[:2], kept + ending])
        diverge = common_prefix_len(served.tokens(edited), served.prompts[-1])
        other = chat(3, system=system, users=[*USERS[:2], "Zebra."])
        content_start = common_prefix_len(served.tokens(other), served.prompts[-1])
        assert diverge > content_start + len(words) // 2
        accepted, _, _ = served.ask(edited)  # processed == the minimum
        assert accepted.reused_tokens >= diverge  # inside the message's text, not at its start
        assert accepted.reprocess_reason == ""


def test_i_two_system_prompts_that_part_in_the_middle(served: Served) -> None:
    opening = "You are a coding agent. Tools: list_files, read_file, run. Keep answers short. "
    a, b = opening + "The date is 2026-03-01 and the directory is /srv/alpha.", opening + "The date is 2026-03-02."
    users_a = [long_user(served), *USERS[1:]]
    for turn in (1, 2):
        served.ask(chat(turn, system=a, users=users_a))
        accepted, _, _ = served.ask(chat(turn, system=b))
        if turn == 1:  # b resumes where the two system prompts part, inside their text
            shared = common_prefix_len(served.tokens(chat(1, system=a)), served.tokens(chat(1, system=b)))
            assert accepted.reused_tokens == shared > 10


def test_j_a_regenerate_that_keeps_the_first_tokens_of_the_old_answer(served: Served) -> None:
    prompt = served.tokens(chat(1, system="Regenerate persona."))
    _, first, _ = ask_tokens(served, prompt, 8)
    # regenerate from a kept part of the answer: the state inside the generated tokens is reached
    accepted, _, finished = ask_tokens(served, [*prompt, *first[:4]], 8)
    assert finished.usage.processed_prompt_tokens == 1 and accepted.reused_tokens == len(prompt) + 3
    assert accepted.reprocess_reason == "no_stored_logits"  # a replay gives no logits: the last token is evaluated


def test_k_a_follow_up_whose_assistant_text_repeats_the_generated_tokens(served: Served) -> None:
    prompt = served.tokens(chat(1, system="Follow-up persona."))
    _, answer, _ = ask_tokens(served, prompt, 8)
    # the client re-renders the answer: its first 5 tokens match, then the text tokenizes otherwise
    tail = [t for t in served.tokens([{"role": "user", "content": USERS[3]}])[-12:] if t != answer[5]]
    follow = [*prompt, *answer[:5], *tail]
    accepted, _, _ = ask_tokens(served, follow)
    assert accepted.reused_tokens == len(prompt) + 5


def test_cache_stats_report_checkpoints_and_the_store(served: Served) -> None:
    for system in ("Xylophone persona.", "Yak persona.", "Yak persona."):
        # the second takes the slot over (the first goes to the store); the third is a resend
        served.record(served.tokens(chat(2, system=system)), run(served.target, messages=chat(2, system=system))[1])
    s = stats(served.target)
    [slot] = s.slots
    assert slot.cached_tokens > 0 and slot.checkpoints
    positions = [cp.position for cp in slot.checkpoints]
    assert positions == sorted(positions) and max(positions) <= slot.cached_tokens  # I2
    assert any(cp.has_logits for cp in slot.checkpoints)
    if served.kind in ("llama", "gemma3", "llama-gpu"):  # attention-only memory: only prompt ends, logits only
        assert {cp.kind.name for cp in slot.checkpoints} == {"PROMPT_END"}
    else:
        assert all(cp.bytes > 0 for cp in slot.checkpoints)
    c = s.counters
    assert c.checkpoints_created >= len(slot.checkpoints) and c.restores > 0
    # a cancelled prompt leaves tokens neither reused nor processed, so only an inequality holds
    assert c.prompt_tokens_received >= c.prompt_tokens_reused + c.prompt_tokens_processed
    assert s.prefix_store.entries > 0 and 0 < s.prefix_store.bytes <= s.prefix_store.budget_bytes


def test_prometheus_endpoint_reports_the_cache_stats_numbers(served: Served) -> None:
    served.ask(chat(1, system="Metrics persona."))
    s = stats(served.target)
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        text = response.read().decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    c = s.counters
    assert samples[("hyserve_prompt_tokens_received_total", ())] == c.prompt_tokens_received
    assert samples[("hyserve_prompt_tokens_reused_total", ())] == c.prompt_tokens_reused
    assert samples[("hyserve_prompt_tokens_processed_total", ())] == c.prompt_tokens_processed
    assert samples[("hyserve_cache_restores_total", ())] == c.restores
    assert samples[("hyserve_checkpoints_created_total", ())] == c.checkpoints_created
    assert samples[("hyserve_prefix_store_hits_total", ())] == c.prefix_store_hits
    assert samples[("hyserve_prefix_store_entries", ())] == s.prefix_store.entries
    for reason, n in c.full_reprocess_by_reason.items():
        assert samples[("hyserve_full_reprocess_total", (("reason", reason),))] == n
    assert samples[("hyserve_slot_cached_tokens", (("slot", "0"),))] == s.slots[0].cached_tokens
    assert [v for (name, _), v in samples.items() if name == "hyserve_num_requests_running"] == [0]  # labelled


def test_bad_cache_options_are_rejected_and_change_nothing(served: Served) -> None:
    before = stats(served.target)
    with HyserveClient(served.target) as client, pytest.raises(HyserveError) as info:
        list(client.generate(messages=chat(1), max_tokens=GEN, checkpoint_offsets=[0]))
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT and "checkpoint_offsets" in info.value.details
    after = stats(served.target)
    assert after.counters == before.counters and after.slots == before.slots
    assert after.prefix_store == before.prefix_store


def test_cache_stats_say_where_the_state_lives(served: Served) -> None:
    """CacheStats.memory: the slots' KV caches on the GPU device with --device gpu, nothing there on
    the CPU; host memory holds the rest (checkpoints with logits at least, after a request)."""
    served.ask(chat(1))
    memory = stats(served.target).memory
    if served.kind.endswith("-gpu"):
        assert memory.device_bytes > 0
    else:
        assert memory.device_bytes == 0
    assert memory.host_bytes > 0
