"""Agent replay: multi-turn agent conversations against the running service, prompt tokens processed
against the minimum that had to be processed.

Starts `hyserve serve --parallel 1` on a model and replays scripted agent sessions (the assistant
turns are recorded ones, as when a client replays a transcript; the model still generates each
turn's answer):

- `agent_append`: a tool loop, each turn appends the assistant's tool call (with its reasoning)
  and the tool's result;
- `reasoning_stripped`: a chat whose template drops the reasoning of assistant turns once a new
  user message arrives (Qwen3.5 style), so each new prompt diverges inside the previous one;
- `edit_last_user`: the last user message is rewritten, twice;
- `regenerate`: the same conversation is sent again, twice;
- `interleaved`: two conversations take turns on the one slot;
- `edit_keep_words`: the last user message rewritten keeping its first ~40 % of words, three times;
- `system_prompts_part`: two conversations whose system prompts share a long opening and part in
  the middle (a date, a working directory), interleaved on the one slot;
- `regenerate_from_answer`: the same prompt followed by the first tokens of the previous answer
  (regenerate from a point inside it), token input;
- `follow_up_repeats_answer`: the next prompt's assistant text is the previous answer decoded and
  re-rendered, so it repeats the generated tokens and parts from them where the text tokenizes
  otherwise.

For every request: tokens processed (Finished.usage) and the minimum = prompt length minus its
longest common prefix with any sequence the server evaluated before (earlier prompts plus their
generated tokens), 0 for an exact resend of an earlier prompt. Prompts are tokenized in-process
with the server's own template and tokenizer code. Prints JSON and writes JSON + PNG.

    python bench/agent_replay.py [--model default|PATH] [--name NAME] [--gen 8] [--threads 2] [--swa-cache ring]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cache_ledger import Ledger
from fixtures.make_models import CHAT_TEMPLATE
from report import publish
from server_process import running_server

from hyserve.logging_setup import configure_logging
from hyserve.model.loader import load_model
from hyserve_client import Accepted, Delta, Finished, HyserveClient

Message = dict[str, Any]
# A request: chat messages, or a function of the previous request (its prompt tokens, answer tokens,
# messages, and the tokenizer) giving token ids or messages
FollowUp = Callable[[list[int], list[int], list[Message], Any], "list[int] | list[Message]"]
Request = list[Message] | FollowUp

SYSTEM = (
    "You are a coding agent working in a Python repository. You can call these tools by writing "
    "<tool_call>{json}</tool_call>:\n"
    '{"name": "list_files", "description": "List the files under a directory", "parameters": {"path": "string"}}\n'
    '{"name": "read_file", "description": "Read a text file", "parameters": {"path": "string", "start": "int", '
    '"end": "int"}}\n'
    '{"name": "run", "description": "Run a shell command and return its output", "parameters": {"cmd": "string"}}\n'
    "Think before each action. Keep answers short and cite file names and line numbers."
)
TOOL_LOOP = [
    (
        "I should see the layout first.",
        '<tool_call>{"name": "list_files", "arguments": {"path": "."}}</tool_call>',
        "README.md\npyproject.toml\nservice/hyserve/engine/engine.py\nservice/hyserve/engine/cache_plan.py\n"
        "service/hyserve/api/server.py\ntests/test_cache_plan.py\n",
    ),
    (
        "The cache logic is in cache_plan.py; read its head.",
        '<tool_call>{"name": "read_file", "arguments": {"path": "service/hyserve/engine/cache_plan.py", "start": 1, '
        '"end": 40}}</tool_call>',
        '"""Prompt-cache decisions as plain functions of state: no model, no memory, no threads.\n\nplan_resume picks '
        "where a prompt resumes on one cached sequence, plan_admissions picks the slot ...\n",
    ),
    (
        "Now run its tests.",
        '<tool_call>{"name": "run", "arguments": {"cmd": "pytest -q tests/test_cache_plan.py"}}</tool_call>',
        "..................................                 [100%]\n34 passed in 1.76s\n",
    ),
    (
        "Check the engine's use of it.",
        '<tool_call>{"name": "run", "arguments": {"cmd": "grep -n plan_admissions '
        'service/hyserve/engine/engine.py"}}</tool_call>',
        "44:    plan_admissions,\n468:            plan = "
        "plan_admissions([(t.prompt, t.cache_prompt) for t in queued], ...)\n",
    ),
]
# First words differ: on recurrent models two user messages that begin alike diverge inside the text,
# where no checkpoint exists (docs/prompt-cache.md: without kept inputs the shared words are processed again).
QUESTIONS = [
    "Where does the server decide which slot a request goes to? Point me at the function.",
    "How are checkpoints evicted when the budget is exceeded? Summarise the order.",
    "Explain what happens to a slot's state when another conversation takes the slot over.",
    "Is there a test that proves the cache never changes an answer? How many examples does it run?",
]
ANSWERS = [
    "In cache_plan.plan_admissions: it compares the resume point on every free slot and store entry.",
    "choose_evictions drops older turns first, interval checkpoints before message boundaries.",
    "the engine (StateStash.put) copies it to the prefix store, keyed by its tokens, before the slot is reused.",
    "Yes: tests/test_cache_transparency.py runs 500 hypothesis examples against a cache-free engine.",
]


PASTED_LOG = "Why does this run fail? Here is the log:\n" + "\n".join(
    f"tests/test_cache_plan.py::test_case_{i} {'FAILED' if i % 9 == 4 else 'PASSED'} [{i * 3}%]" for i in range(30)
)


def tool_loop(turns: int) -> list[list[Message]]:
    convo: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    out = [list(convo)]
    for reasoning, call, result in TOOL_LOOP[:turns]:
        convo += [
            {"role": "assistant", "content": call, "reasoning_content": reasoning},
            {"role": "tool", "content": result},
        ]
        out.append(list(convo))
    return out


def chat_turns(questions: Sequence[str], system: str = SYSTEM) -> list[list[Message]]:
    convo: list[Message] = [{"role": "system", "content": system}]
    out = []
    for i, q in enumerate(questions):
        if i:
            convo.append({"role": "assistant", "content": ANSWERS[i - 1], "reasoning_content": f"Step {i}: check."})
        convo.append({"role": "user", "content": q})
        out.append(list(convo))
    return out


def rotated(k: int, n: int = 3) -> list[str]:
    return [QUESTIONS[(k + i) % len(QUESTIONS)] for i in range(n)]


def keep_words(text: str, fraction: float, ending: str) -> str:
    """The text up to the end of its first `fraction` of words (as written), then `ending`."""
    words = list(re.finditer(r"\S+", text))
    return text[: words[max(1, round(len(words) * fraction)) - 1].end()] + ending


def regenerate_from(k: int) -> FollowUp:
    """The previous prompt and the first k tokens of its answer, as token ids."""
    return lambda prompt, answer, _messages, _tok: [*prompt, *answer[:k]]


def follow_up_with_answer(question: str) -> FollowUp:
    """The previous conversation, its answer decoded as the assistant message, then a new question."""

    def build(prompt: list[int], answer: list[int], messages: list[Message], tok: Any) -> list[Message]:
        text = tok.decode(answer)
        return [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": question}]

    return build


def scenarios() -> dict[str, list[Request]]:
    """Each scenario opens with its own question order (same agent, same system prompt)."""
    chat3 = chat_turns(rotated(1))
    edited = [
        [*chat3[-1][:-1], {"role": "user", "content": "Actually, first explain what a checkpoint holds and why."}],
        [*chat3[-1][:-1], {"role": "user", "content": "Never mind; list the gRPC status codes the server uses."}],
    ]
    again = chat_turns(rotated(2))
    a = chat_turns(rotated(3))
    b = chat_turns(["List the RPCs the service defines; which one streams?", QUESTIONS[2], QUESTIONS[0]])
    # the new scenarios' system prompts add a line each: their prompts never repeat an earlier
    # scenario's exactly (the minimum of an exact repeat is 0)
    # the last question pastes a test log: long enough that its first words lie beyond what a ring
    # window cache still holds when the edits come
    chat4 = chat_turns([*rotated(0, 3), PASTED_LOG], SYSTEM + "\nStyle: one paragraph.")
    rewrites = [
        [*chat4[-1][:-1], {"role": "user", "content": keep_words(PASTED_LOG, 0.4, ending)}]
        for ending in (" Which test failed first?", " Ignore the warnings; why is it slow?", " Summarise it.")
    ]
    opening = SYSTEM + "\nWorking directory: /home/agent/projects/"
    sys_a, sys_b = opening + "hyserve (date 2026-03-01).", opening + "kernels (date 2026-03-02)."
    pa, pb = chat_turns(rotated(1), sys_a), chat_turns(rotated(2), sys_b)
    regen = chat_turns(rotated(3, 2), SYSTEM + "\nFormat: a list.")[-1]
    follow = chat_turns(rotated(0, 1), SYSTEM + "\nOutput: code first.")[-1]
    return {
        "agent_append": tool_loop(4),
        "reasoning_stripped": chat_turns(QUESTIONS),
        "edit_last_user": [*chat3, *edited],
        "regenerate": [*again, again[-1], again[-1]],
        "interleaved": [m for pair in zip(a, b) for m in pair],
        "edit_keep_words": [*chat4, *rewrites],
        "system_prompts_part": [m for pair in zip(pa, pb) for m in pair],
        "regenerate_from_answer": [regen, regenerate_from(6), regen, regenerate_from(3)],
        "follow_up_repeats_answer": [follow, follow_up_with_answer(QUESTIONS[1]), follow_up_with_answer(QUESTIONS[2])],
    }


def replay(target: str, ledger: Ledger, gen: int) -> list[dict]:
    rows = []
    tokenizer = ledger.model.tokenizer
    with HyserveClient(target) as client:
        for name, requests in scenarios().items():
            prompt, generated, messages = [], [], []
            for turn, request in enumerate(requests, 1):
                made = request(prompt, generated, messages, tokenizer) if callable(request) else request
                if made and isinstance(made[0], dict):
                    messages = list(made)
                    prompt, kwargs = ledger.tokens(messages), {"messages": messages}
                else:
                    prompt, kwargs = list(made), {"token_ids": list(made)}
                minimum = ledger.minimum(prompt)
                start = time.perf_counter()
                events = list(client.generate(max_tokens=gen, ignore_eos=True, **kwargs))
                seconds = time.perf_counter() - start
                accepted, finished = events[0], events[-1]
                assert isinstance(accepted, Accepted) and isinstance(finished, Finished)
                assert accepted.prompt_tokens == len(prompt), "client and server tokenize alike"
                generated = [t for e in events if isinstance(e, Delta) for t in e.token_ids]
                ledger.record(prompt, generated)
                processed = finished.usage.processed_prompt_tokens
                rows.append(
                    {
                        "scenario": name,
                        "turn": turn,
                        "prompt_tokens": len(prompt),
                        "reused": accepted.reused_tokens,
                        "source": accepted.reuse_source.value,
                        "reason": accepted.reprocess_reason,
                        "processed": processed,
                        "minimum": minimum,
                        "ratio": processed / minimum if minimum else (1.0 if processed == 0 else float("inf")),
                        "request_s": round(seconds, 3),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def summarise(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["scenario"] for r in rows):
        sel = [r for r in rows if r["scenario"] == name]
        processed, minimum = sum(r["processed"] for r in sel), sum(r["minimum"] for r in sel)
        out[name] = {
            "requests": len(sel),
            "prompt_tokens": sum(r["prompt_tokens"] for r in sel),
            "processed": processed,
            "minimum": minimum,
            "processed_over_minimum": processed / minimum if minimum else 1.0,
            "worst_turn_ratio": max(r["ratio"] for r in sel),
        }
    return out


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["scenarios"])
    s = result["scenarios"]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar([i - 0.2 for i in x], [s[n]["prompt_tokens"] for n in names], 0.2, label="prompt tokens sent")
    ax.bar(list(x), [s[n]["minimum"] for n in names], 0.2, label="minimum to process")
    ax.bar([i + 0.2 for i in x], [s[n]["processed"] for n in names], 0.2, label="processed by hyserve")
    for i, n in enumerate(names):
        ax.text(i + 0.2, s[n]["processed"], f"{s[n]['processed_over_minimum']:.2f}x", ha="center", va="bottom")
    ax.set_xticks(list(x), names, rotation=15)
    ax.set_ylabel("tokens")
    ax.set_title(f"agent replay on {result['model']}: processed / minimum")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--name", default="agent_replay_gemma3_270m", help="output file name (without extension)")
    ap.add_argument("--gen", type=int, default=8, help="tokens generated per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--swa-cache", choices=("full", "ring"), default="full", help="the server's --swa-cache")
    ap.add_argument("--replay-memory", type=int, default=None, help="the server's --replay-memory (MiB)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template.jinja"  # Qwen3.5-style: drops earlier reasoning
        template.write_text(CHAT_TEMPLATE)
        model = load_model(args.model, template)
        server_args = ["--model", args.model, "--chat-template", str(template), "--parallel", "1"]
        server_args += ["--ctx-size", "4096", "--threads", str(args.threads), "--swa-cache", args.swa_cache]
        if args.replay_memory is not None:
            server_args += ["--replay-memory", str(args.replay_memory)]
        start = time.perf_counter()
        with running_server(Path(tmp) / "server.log", *server_args) as target:
            rows = replay(target, Ledger(model), args.gen)
            with HyserveClient(target) as client:
                stats = client.cache_stats()
        wall = time.perf_counter() - start
    result = {
        "model": f"{model.gguf.architecture} {model.path.name}",
        "threads": args.threads,
        "swa_cache": args.swa_cache,
        "replay_memory_mib": args.replay_memory,
        "gen_tokens_per_request": args.gen,
        "wall_s": round(wall, 1),
        "scenarios": summarise(rows),
        "total": summarise([{**r, "scenario": "all"} for r in rows])["all"],
        "counters": {
            "restores": stats.counters.restores,
            "checkpoints_created": stats.counters.checkpoints_created,
            "checkpoints_evicted": stats.counters.checkpoints_evicted,
            "prefix_store_hits": stats.counters.prefix_store_hits,
            "replays": stats.counters.replays,
            "replayed_tokens": stats.counters.replayed_tokens,
            "input_blocks_evicted": stats.counters.input_blocks_evicted,
            "reprocessed_tokens_by_reason": stats.counters.reprocessed_tokens_by_reason,
            "full_reprocess_by_reason": stats.counters.full_reprocess_by_reason,
        },
        "turns": rows,
    }
    publish(result, args.out, args.name, draw, shown={k: v for k, v in result.items() if k != "turns"})


if __name__ == "__main__":
    main()
