"""Chat templates: render a model's Jinja chat template and find where each message starts.

GGUF files carry the model's chat template in ``tokenizer.chat_template``: the Jinja source copied
from the Hugging Face ``tokenizer_config.json`` / ``chat_template.jinja``. We render it with the
same semantics as ``transformers`` (``apply_chat_template``) and ``llama.cpp --jinja``:

* ``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the
  ``loopcontrols`` extension (``{% break %}`` / ``{% continue %}``); templates cannot mutate the
  messages and cannot reach Python internals;
* ``{% generation %}...{% endgeneration %}`` (used by some training templates) is accepted and
  renders its body unchanged, as transformers does when it is not collecting assistant masks;
* globals ``raise_exception(msg)`` (raises :class:`ChatTemplateError` whose message is exactly
  ``msg``) and ``strftime_now(fmt)`` (local time, frozen once per :meth:`ChatTemplate.render`
  call so that all the renders one call makes agree);
* a ``tojson`` filter with transformers' signature ``tojson(ensure_ascii=False, indent=None,
  separators=None, sort_keys=False)``: no HTML escaping and no ``\\uXXXX`` escaping of non-ASCII;
* variables ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools`` (a list
  of dicts or ``None``), ``documents`` (``None`` unless given) and any extra keyword argument
  (``enable_thinking=False`` for Qwen, ...). Extra keywords override ``bos_token`` / ``eos_token``
  the way transformers lets ``apply_chat_template`` kwargs override the special-token map.

Messages, tools and extra arguments are deep-copied into plain ``dict`` / ``list`` values first,
so any ``Mapping`` / ``Sequence`` works as input and templates see what they see under
transformers (attribute access ``message.role`` falls back to item access for dicts).

Any failure while rendering (``raise_exception``, undefined values, type errors inside the
template, sandbox violations) becomes a :class:`ChatTemplateError` (a ``ValueError``), so the API
layer can answer ``INVALID_ARGUMENT``. Syntax errors are reported by the constructor, naming the
template.

Message offsets
---------------
:meth:`ChatTemplate.render` also returns, for every input message, the character offset in the
rendered text where that message's rendering starts. The prompt cache takes checkpoints there, so
an offset that is too early only costs some recomputation, while one that is too late could put a
checkpoint after the start of an edited message. Every heuristic below therefore prefers erring
early. The boundary before message ``i`` (``0 <= i <= n``; ``i == n`` is where the generation
prompt starts) is found as follows, first rule that applies wins:

1. **Prefix rule (exact for append-only templates).** Render ``messages[:i]`` without generation
   prompt. If that text is a prefix of the full rendering, message ``i`` starts at its length.
   This covers ChatML, Gemma 3 (whose empty-conversation render fails, see 3, and whose system
   message is folded into the first user turn: the system message's rendering then starts at 0
   and the user message's right after ``<bos>``), Qwen without dropped reasoning, and the
   fallback template.
2. **Realignment after rewritten history.** Some templates render earlier messages differently
   depending on later ones: Qwen3 / Qwen3.5 drop the ``<think>`` block of assistant turns that
   come before the last user query, and Qwen closes a tool result with ``<|im_end|>`` only when
   no other tool result follows. Then ``P = render(messages[:i])`` is not a prefix of the full
   text ``T``; let ``d`` be the length of their common prefix. We assume ``T``'s rendering of
   ``messages[:i]`` is ``P`` with some chunks deleted, minus possibly a trailer at the end of
   ``P``, and align greedily: skip ``P`` up to the next place where the following
   ``_SYNC_CHARS`` (8) characters of ``T`` occur, consume the common run, repeat. When ``P`` is
   used up, its end is the boundary. When ``T``'s next characters no longer occur in the rest of
   ``P``, that rest is a trailer and the boundary is where we stopped (stepping back up to 8
   characters if ``T`` ends like ``P`` there, in case the last run overshot by coincidence).
   Runs never start on fewer than 8 matching characters, so a stray newline cannot push the
   boundary late.
3. **Suffix rule, when rendering the prefix raises.** Templates may refuse a prefix: Gemma 3 and
   most others fail on an empty conversation, Qwen3.5 raises "No user query found in messages."
   for ``[system]``. Then we render ``messages[i:]`` (without tools, because tool definitions
   live in a block at the top, then with the same tools), and if that text is a suffix of the
   full rendering, message ``i`` starts at ``len(text) - len(suffix)`` (if that is not before
   the previous boundary). This can be late when a message renders differently as the first
   one (Qwen opens a group of tool results with ``<|im_start|>user`` only after a non-tool
   message); it is only used when the prefix itself cannot be rendered.
4. **Fallback.** Otherwise the boundary is the previous message's boundary (0 for the first).

Finally the offsets are made non-decreasing by lowering any offset that exceeds a later one, and
clamped to ``len(text)``.

Cost: ``n + 1`` extra renders of growing prefixes (plus up to two suffix renders per prefix that
raises), i.e. quadratic in the conversation length (Qwen3.5 template: about 0.1 s for 200 kB /
40 messages, 1.3 s for 450 kB / 200 messages, rendering dominating). To keep long multi-turn
conversations cheap, each template remembers its last few renderings (``_Memo``; at most 16
entries and 4 M characters): a boundary is reused when ``messages[:i]`` and the context are
unchanged and the new text agrees with the old one on everything the boundary's computation
looked at. The next turn of a conversation then only renders the prefixes ending in its new
messages.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "RenderedChat",
]

FALLBACK_TEMPLATE_RESOURCE = "templates/fallback.jinja"

# Rule 2 resynchronises after a rewritten chunk only on a match at least this long.
_SYNC_CHARS = 8


class ChatTemplateError(ValueError):
    """The chat template could not be compiled, or refused / failed to render the messages.

    For ``raise_exception(msg)`` calls from a template, ``str(error) == msg`` exactly.
    ``template_name`` names the template (``"model"``, ``"fallback"``, a file name, ...).
    """

    def __init__(self, message: str, template_name: str | None = None) -> None:
        super().__init__(message)
        self.template_name = template_name


@dataclass(frozen=True)
class RenderedChat:
    """A rendered conversation.

    ``message_char_offsets[i]`` is the offset in ``text`` where message ``i``'s rendering starts
    (non-decreasing, each ``<= len(text)``; see the module docstring for how it is found).
    ``generation_prompt_offset`` is where the rendering of all messages ends, i.e. where the
    generation prompt (``<|im_start|>assistant\\n`` ...) starts; ``len(text)`` when there is none.
    It is the start of the next assistant message in the next turn's conversation, so it is a
    good checkpoint position too. (``None`` only when a caller builds a ``RenderedChat`` itself.)
    """

    text: str
    message_char_offsets: list[int]
    generation_prompt_offset: int | None = None


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (transformers marks assistant
    tokens with it when asked for an assistant mask; otherwise it is a no-op)."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: Sequence[str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain ``json.dumps`` (no HTML escaping), non-ASCII kept."""
    seps = None if separators is None else (str(separators[0]), str(separators[1]))
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=seps, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _plain(value: Any) -> Any:
    """Deep copy into dict / list so templates and ``tojson`` see plain JSON-like data."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


class ChatTemplate:
    """A compiled chat template. Thread-safe (the only state kept between calls is a small memo
    of recent renderings used to speed up offset computation, behind a lock)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "model") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        self._memo = _Memo()
        self._memo_lock = threading.Lock()

        def raise_exception(message: Any) -> None:
            raise ChatTemplateError(str(message), template_name=name)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"chat template {name!r} has a syntax error at line {exc.lineno}: {exc.message}",
                template_name=name,
            ) from exc
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template {name!r} could not be compiled: {exc}", template_name=name) from exc

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"

    @classmethod
    def fallback(cls, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """The plain-text template shipped in ``templates/fallback.jinja`` (format documented at
        the top of that file), for models without ``tokenizer.chat_template``."""
        source = (
            resources.files(__package__ or "hyserve.model")
            .joinpath(FALLBACK_TEMPLATE_RESOURCE)
            .read_text(encoding="utf-8")
        )
        return cls(source, bos_token=bos_token, eos_token=eos_token, name="fallback")

    @classmethod
    def from_file(cls, path: Path, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """A template read from a file (``--chat-template FILE``), named after the file."""
        path = Path(path)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(
                f"cannot read chat template file {str(path)!r}: {exc}", template_name=path.name
            ) from exc
        return cls(source, bos_token=bos_token, eos_token=eos_token, name=path.name)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> RenderedChat:
        """Render the conversation and locate each message in the result."""
        msgs: list[Any] = [_plain(message) for message in messages]
        now = datetime.now()
        context: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": None if tools is None else [_plain(tool) for tool in tools],
            "documents": None,
            "strftime_now": now.strftime,
        }
        context.update({key: _plain(value) for key, value in kwargs.items()})
        text = self._render(msgs, add_generation_prompt, context)
        keys = _prefix_keys(msgs, context)
        with self._memo_lock:
            earlier = self._memo.best_match(keys)
        finder = _Boundaries(self, msgs, add_generation_prompt, context, text)
        raw = finder.compute_raw(earlier, keys)
        if keys is not None:
            with self._memo_lock:
                self._memo.put(_MemoEntry(keys=keys, text=text, raw=raw))
        bounds = _monotone([min(max(b, 0), len(text)) for b, _ in raw])
        return RenderedChat(text=text, message_char_offsets=bounds[:-1], generation_prompt_offset=bounds[-1])

    # -- internals ---------------------------------------------------------------------------

    def _render(self, msgs: list[Any], add_generation_prompt: bool, context: Mapping[str, Any]) -> str:
        try:
            return self._template.render({**context, "messages": msgs, "add_generation_prompt": add_generation_prompt})
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(
                f"chat template {self.name!r} failed to render: {exc}", template_name=self.name
            ) from exc
        except Exception as exc:  # TypeError, KeyError, RecursionError... raised inside the template
            raise ChatTemplateError(
                f"chat template {self.name!r} failed to render: {type(exc).__name__}: {exc}",
                template_name=self.name,
            ) from exc

    def _try_render(self, msgs: list[Any], add_generation_prompt: bool, context: Mapping[str, Any]) -> str | None:
        try:
            return self._render(msgs, add_generation_prompt, context)
        except ChatTemplateError:
            return None


# A boundary as computed, with how much of the full text the computation looked at: it stays
# valid for another rendering of a conversation with the same messages[:i] (same context) whose
# text agrees on that many characters. _ANYWHERE: it depended on the whole text.
_Raw = tuple[int, int]
_ANYWHERE = sys.maxsize


class _Boundaries:
    """Computes the boundary before each message (see the module docstring)."""

    def __init__(
        self,
        template: ChatTemplate,
        msgs: list[Any],
        add_generation_prompt: bool,
        context: dict[str, Any],
        text: str,
    ) -> None:
        self.template = template
        self.msgs = msgs
        self.agp = add_generation_prompt
        self.context = context
        self.text = text

    def compute_raw(self, earlier: _MemoEntry | None, keys: list[bytes] | None) -> list[_Raw]:
        """Boundaries before messages 0..n, reusing those of an earlier rendering that shared
        the messages before them and agreed on all the text they depended on."""
        reusable, agree = 0, 0
        if earlier is not None and keys is not None:
            reusable = _common_prefix_len_seq(earlier.keys, keys)
            agree = _common_prefix_len(earlier.text, self.text)
        raw: list[_Raw] = []
        prev = 0
        for i in range(len(self.msgs) + 1):
            if earlier is not None and i < reusable and earlier.raw[i][1] <= agree:
                found = earlier.raw[i]
            else:
                found = self._boundary(i, prev)
            raw.append(found)
            prev = min(max(found[0], 0), len(self.text))
        return raw

    def _boundary(self, i: int, prev: int) -> _Raw:
        text = self.text
        n = len(self.msgs)
        prefix = self.template._try_render(self.msgs[:i], False, self.context)
        if prefix is not None:
            # Rule 1: the prefix render is a prefix of the full text.
            if text.startswith(prefix):
                return len(prefix), len(prefix)
            # Rule 2: the template rewrote earlier messages; realign.
            return _align_deletions(text, _common_prefix_len(prefix, text), prefix)
        # Rule 3: the prefix cannot be rendered on its own; try the suffix.
        if i < n:
            # Without tools first: tool definitions sit in a block at the very top, which a
            # suffix render of messages[i:] must not repeat.
            tools_variants: list[Any] = [None]
            if self.context.get("tools") is not None:
                tools_variants.append(self.context["tools"])
            for tools in tools_variants:
                suffix = self.template._try_render(self.msgs[i:], self.agp, {**self.context, "tools": tools})
                if suffix and text.endswith(suffix) and len(text) - len(suffix) >= prev:
                    return len(text) - len(suffix), _ANYWHERE
        # Rule 4.
        return prev, _ANYWHERE


def _monotone(bounds: list[int]) -> list[int]:
    """Lower any boundary that exceeds a later one."""
    for i in range(len(bounds) - 2, -1, -1):
        bounds[i] = min(bounds[i], bounds[i + 1])
    return bounds


@dataclass(frozen=True)
class _MemoEntry:
    keys: list[bytes]  # keys[i] identifies (context, messages[:i]); len(keys) == n + 1
    text: str
    raw: list[_Raw]


class _Memo:
    """The last few rendered conversations of one template, so that the next turn of a
    conversation only renders the prefixes that end in its new messages. Bounded by entry
    count and total text size. Not thread-safe by itself (the template holds a lock)."""

    MAX_ENTRIES = 16
    MAX_CHARS = 4_000_000

    def __init__(self) -> None:
        self._entries: list[_MemoEntry] = []  # most recent last

    def best_match(self, keys: list[bytes] | None) -> _MemoEntry | None:
        if keys is None:
            return None
        best, best_len = None, 0
        for entry in reversed(self._entries):  # the most recent wins ties
            shared = _common_prefix_len_seq(entry.keys, keys)
            if shared > best_len:
                best, best_len = entry, shared
        return best

    def put(self, entry: _MemoEntry) -> None:
        if len(entry.text) > self.MAX_CHARS:
            return
        # The new entry supersedes entries for the same conversation that it extends.
        self._entries = [e for e in self._entries if _common_prefix_len_seq(e.keys, entry.keys) < len(e.keys)]
        self._entries.append(entry)
        total = sum(len(e.text) for e in self._entries)
        while len(self._entries) > self.MAX_ENTRIES or total > self.MAX_CHARS:
            total -= len(self._entries.pop(0).text)


def _prefix_keys(msgs: list[Any], context: Mapping[str, Any]) -> list[bytes] | None:
    """keys[i] identifies the context plus messages[:i] (order-sensitive, like templates), or
    None if something is not JSON-serialisable (then nothing is memoised)."""
    try:
        ctx = json.dumps({k: v for k, v in context.items() if k != "strftime_now"}, ensure_ascii=False)
        parts = [json.dumps(m, ensure_ascii=False) for m in msgs]
    except (TypeError, ValueError):
        return None
    key = hashlib.blake2b(ctx.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    keys = [key]
    for part in parts:
        key = hashlib.blake2b(key + part.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        keys.append(key)
    return keys


def _common_prefix_len_seq(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _match_len(a: str, i: int, b: str, j: int) -> int:
    """Largest m with ``a[i:i + m] == b[j:j + m]``; cost O(m), not O(len)."""
    limit = min(len(a) - i, len(b) - j)
    lo, step = 0, 64  # invariant: a[i:i + lo] == b[j:j + lo]
    while True:
        hi = min(lo + step, limit)
        if hi == lo:
            return lo
        if not b.startswith(a[i + lo : i + hi], j + lo):
            break
        lo, step = hi, step * 2
    while hi - lo > 1:  # the first mismatch lies in [lo, hi)
        mid = (lo + hi) // 2
        if b.startswith(a[i + lo : i + mid], j + lo):
            lo = mid
        else:
            hi = mid
    return lo


def _common_prefix_len(a: str, b: str) -> int:
    return _match_len(a, 0, b, 0)


def _align_deletions(text: str, d: int, prefix: str) -> _Raw:
    """Where the rendering of ``prefix``'s messages ends in ``text`` (and how far into ``text``
    the search looked), assuming ``text`` renders
    them as ``prefix`` does except that some chunks were deleted (dropped reasoning) and
    ``prefix`` may end with a trailer that ``text`` lacks (e.g. a closing only emitted after the
    last message). ``prefix[:d] == text[:d]`` and they differ at ``d``.

    Greedy: after each mismatch, skip prefix characters up to the next place where the next
    ``_SYNC_CHARS`` characters of ``text`` occur, consume the common run, repeat. When
    ``prefix`` is used up, the end is found. When ``text``'s next characters do not occur in the
    rest of ``prefix``, that rest is a trailer and the end is where we are, stepping back a few
    characters if the last run overshot (``text`` ends like ``prefix`` a little earlier). Short
    coincidental matches (a lone newline) never start a run, which errs towards an earlier end.
    """
    r = f = d
    last_run = 0
    while r < len(prefix):
        anchor = text[f : f + _SYNC_CHARS]
        if len(anchor) < _SYNC_CHARS:
            break
        j = prefix.find(anchor, r + 1)
        if j < 0:
            break
        last_run = _match_len(prefix, j, text, f)
        r, f = j + last_run, f + last_run
    # Everything examined lies before f + _SYNC_CHARS + 1 (the last anchor, the mismatch).
    examined = f + _SYNC_CHARS + 1
    if r < len(prefix) and last_run:
        # prefix was not used up. If the last run overshot by a few coincidental characters
        # (text continues like prefix's leftover), step back to where text ends like prefix.
        tail = prefix[-_SYNC_CHARS:]
        for x in range(f, f - min(last_run, _SYNC_CHARS) - 1, -1):
            if text.endswith(tail, 0, x):
                return x, examined
    return f, examined
