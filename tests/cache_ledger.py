"""What a server has evaluated so far, to know the fewest prompt tokens a request must process.

Shared by tests/test_cache_scenarios.py and bench/agent_replay.py. Prompts are tokenized in-process
with the server's own template and tokenizer code. The minimum for a prompt is its length minus its
longest common prefix with any sequence the server evaluated before (earlier prompts plus their
generated tokens but the last, which is sampled and never evaluated), and 0 for an exact resend
of an earlier prompt (its logits are kept).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hyserve.api.validation import prompt_tokens
from hyserve.engine.cache_plan import common_prefix_len
from hyserve.model.loader import LoadedModel
from hyserve_client import build_generate_request


class Ledger:
    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.evaluated: list[list[int]] = []  # sequences whose state the server computed
        self.prompts: list[list[int]] = []  # prompts whose last logits it has seen

    def tokens(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> list[int]:
        request = build_generate_request(messages=messages, **kwargs)
        ids, _ = prompt_tokens(request, self.model.tokenizer, self.model.chat_template)
        return ids

    def minimum(self, prompt: list[int]) -> int:
        """Prompt tokens that must be evaluated: those no earlier evaluation has covered."""
        if prompt in self.prompts:
            return 0
        seen = max((common_prefix_len(prompt, e) for e in self.evaluated), default=0)
        return len(prompt) - min(seen, len(prompt) - 1)

    def record(self, prompt: list[int], generated: Sequence[int]) -> None:
        self.evaluated.append(prompt + list(generated[:-1]))
        self.prompts.append(prompt)
