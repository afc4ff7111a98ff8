"""Command line for a running hyserve server.

    python -m hyserve_client generate "Once upon a time" --max-tokens 64 --target localhost:50051
    python -m hyserve_client generate --chat "Why is the sky blue?" --template-kwarg enable_thinking=false
    python -m hyserve_client generate "A JSON user record:" --json-schema user.schema.json
    python -m hyserve_client generate --chat "Weather in Paris?" --tools tools.json --tool-choice required
    python -m hyserve_client cancel TASK_ID
    python -m hyserve_client stats
    python -m hyserve_client model-info

`generate` streams the completion text to stdout, the model's reasoning (chat) and a one-line summary
to stderr, then the tool calls the answer made as JSON lines on stdout (or every event as a JSON line
with --json); Ctrl-C cancels the task. `stats` and `model-info` print JSON. The target
defaults to $HYSERVE_TARGET, else localhost:50051. Exit status: 0 ok, 1 gRPC error, 130 interrupted.

Other programs embed these commands with `add_subcommands(subparsers)`: every subcommand sets
`func`, a callable taking the parsed arguments and returning the exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from hyserve_client.client import HyserveClient, HyserveError
from hyserve_client.requests import GenerateParams, Message
from hyserve_client.security import tls_credentials
from hyserve_client.types import Accepted, CancelStatus, Delta, Finished, ToolCall

__all__ = ["DEFAULT_TARGET", "add_subcommands", "build_parser", "main"]

DEFAULT_TARGET = "localhost:50051"

Handler = Callable[[argparse.Namespace], int]


def _default_target() -> str:
    return os.environ.get("HYSERVE_TARGET") or DEFAULT_TARGET


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=None, help=f"server address host:port (default: $HYSERVE_TARGET or {DEFAULT_TARGET})"
    )
    p.add_argument("--timeout", type=float, default=None, help="deadline of the call in seconds (default: none)")
    sec = p.add_argument_group("security")
    sec.add_argument("--token", default=None, help="bearer token (default: $HYSERVE_TOKEN)")
    sec.add_argument("--tls", action="store_true", help="use TLS, verifying the server with the system's CAs")
    sec.add_argument("--tls-ca", default=None, help="use TLS, verifying the server with this PEM CA")
    sec.add_argument("--tls-cert", default=None, help="client certificate (PEM) for mutual TLS")
    sec.add_argument("--tls-key", default=None, help="private key (PEM) of --tls-cert")


def _client(args: argparse.Namespace) -> HyserveClient:
    credentials = None
    if args.tls or args.tls_ca or args.tls_cert:
        credentials = tls_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    token = args.token or os.environ.get("HYSERVE_TOKEN") or None
    return HyserveClient(args.target or _default_target(), timeout=args.timeout, credentials=credentials, token=token)


def _jsonable(value: Any) -> Any:
    """A JSON-ready copy of a result dataclass: enums as strings, token pieces as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value


def _token_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids separated by commas or spaces, got {text!r}") from None


def _template_kwarg(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)  # true/false/numbers/JSON objects keep their type
    except json.JSONDecodeError:
        return key, raw


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None


def _json_or_file(text: str) -> Any:
    """JSON given inline (starting with { or [), else the JSON content of the file of that name."""
    return _json_value(text if text.lstrip().startswith(("{", "[")) else _read_file(text))


def _tool_choice(text: str) -> Any:
    return text if text in ("auto", "none", "required") else {"function": text}


def _tool_call_line(call: ToolCall) -> str:
    try:
        arguments = call.arguments()
    except json.JSONDecodeError:
        arguments = call.arguments_json  # shown as the model wrote it
    return json.dumps({"id": call.id, "name": call.name, "arguments": arguments}, ensure_ascii=False)


def _generate_params(args: argparse.Namespace) -> GenerateParams:
    chosen: dict[str, Any] = {}
    for key in (
        "task_id",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "max_tokens",
    ):
        value = getattr(args, key)
        if value is not None:
            chosen[key] = value
    params = cast(GenerateParams, chosen)
    if args.stop:
        params["stop"] = args.stop
    if args.stop_token_ids:
        params["stop_token_ids"] = args.stop_token_ids
    if args.ignore_eos:
        params["ignore_eos"] = True
    if args.top_logprobs:
        params["top_logprobs"] = args.top_logprobs
    if args.logprobs:
        params["logprobs"] = True
    if args.no_cache_prompt:
        params["cache_prompt"] = False
    if args.checkpoint_offset:
        params["checkpoint_offsets"] = args.checkpoint_offset
    if args.template_kwarg:
        params["chat_template_kwargs"] = dict(args.template_kwarg)
    if args.parse_special:
        params["parse_special"] = True
    if args.json_schema is not None:
        params["json_schema"] = args.json_schema
    if args.json_object:
        params["json_object"] = True
    if args.regex is not None:
        params["regex"] = args.regex
    if args.grammar is not None:
        params["grammar"] = args.grammar
    if args.tools is not None:
        params["tools"] = args.tools
    if args.tool_choice is not None:
        params["tool_choice"] = args.tool_choice
    if args.no_parallel_tool_calls:
        params["parallel_tool_calls"] = False
    if args.no_parse_output:
        params["parse_output"] = False
    return params


def _summary(accepted: Accepted | None, finished: Finished) -> str:
    u, t = finished.usage, finished.timings
    parts = [f"finish: {finished.reason}"]
    if finished.stop_string:
        parts[0] += f" ({finished.stop_string!r})"
    parts.append(f"{u.completion_tokens} tokens")
    reused = f"{u.cached_prompt_tokens} reused"
    if accepted is not None:
        reused += f" ({accepted.reuse_source}, matched {accepted.matched_tokens})"
    parts.append(f"prompt {u.prompt_tokens}: {reused}")
    parts.append(f"ttft {t.time_to_first_token_ms:.0f} ms")
    if t.generation_ms > 0 and u.completion_tokens > 1:
        parts.append(f"{(u.completion_tokens - 1) * 1000.0 / t.generation_ms:.1f} tok/s")
    if accepted is not None:
        parts.append(f"task {accepted.task_id} on slot {accepted.slot_index}")
    return "[" + " | ".join(parts) + "]"


def _run_generate(args: argparse.Namespace) -> int:
    if args.tokens is not None and (args.prompt is not None or args.chat):
        print("error: give either a prompt or --tokens", file=sys.stderr)
        return 2
    chat_only = args.system or args.template_kwarg or args.tools is not None or args.tool_choice is not None
    if not args.chat and (chat_only or args.no_parallel_tool_calls or args.no_parse_output):
        print(
            "error: --system, --template-kwarg, --tools, --tool-choice, --no-parallel-tool-calls and"
            " --no-parse-output need --chat",
            file=sys.stderr,
        )
        return 2
    if args.tools is not None and not isinstance(args.tools, list):
        print("error: --tools must be a JSON list of tools", file=sys.stderr)
        return 2
    if args.parse_special and (args.chat or args.tokens is not None):
        print("error: --parse-special applies to a plain text prompt only", file=sys.stderr)
        return 2
    prompt = args.prompt
    if prompt is None and args.tokens is None:
        prompt = sys.stdin.read()
    text: str | None = None
    messages: list[Message] | None = None
    if args.chat:
        messages = ([Message("system", args.system)] if args.system else []) + [Message("user", prompt)]
    elif args.tokens is None:
        text = prompt
    params = _generate_params(args)
    out, err = sys.stdout, sys.stderr
    reasoning_open = False  # reasoning was written to stderr and its line is not ended yet
    with _client(args) as client:
        try:
            stream = client.generate(text, token_ids=args.tokens, messages=messages, **params)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            for event in stream:
                if args.json:
                    out.write(json.dumps({type(event).__name__.lower(): _jsonable(event)}, ensure_ascii=False) + "\n")
                elif isinstance(event, Delta):
                    if event.reasoning and not args.quiet:
                        err.write(event.reasoning)
                        err.flush()
                        reasoning_open = True
                    if event.text and reasoning_open:
                        err.write("\n")
                        reasoning_open = False
                    out.write(event.text)
                out.flush()
        except KeyboardInterrupt:
            stream.cancel()
            print("\n[interrupted: task cancelled]", file=sys.stderr)
            return 130
        except HyserveError as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            return 1
    if not args.json:
        out.write("\n")
        if reasoning_open:
            err.write("\n")
        for call in stream.finished.tool_calls if stream.finished is not None else ():
            out.write(_tool_call_line(call) + "\n")
        if stream.finished is not None and not args.quiet:
            print(_summary(stream.accepted, stream.finished), file=sys.stderr)
    return 0


def _run_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        try:
            status = client.cancel(args.task_id)
        except HyserveError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(status)
    if status is CancelStatus.PENDING:
        print("no task with this id yet: the server cancels it if it registers within 10 s", file=sys.stderr)
    return 0


def _run_unary(method: str) -> Handler:
    def run(args: argparse.Namespace) -> int:
        with _client(args) as client:
            try:
                result = getattr(client, method)()
            except HyserveError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
        print(json.dumps(_jsonable(result), indent=2, ensure_ascii=False))
        return 0

    return run


def add_subcommands(subparsers: Any, *, prefix: str = "") -> None:
    """Add generate / cancel / stats / model-info (named `prefix + name`) to an argparse subparsers object."""
    gen = subparsers.add_parser(
        prefix + "generate", help="stream a completion from a server", description="Stream a completion from a server."
    )
    gen.add_argument("prompt", nargs="?", help="prompt text (default: read standard input)")
    _add_connection_args(gen)
    inp = gen.add_argument_group("input")
    inp.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    inp.add_argument("--system", help="system message to put before the user message (with --chat)")
    inp.add_argument(
        "--template-kwarg",
        action="append",
        type=_template_kwarg,
        metavar="KEY=VALUE",
        help="chat template variable, VALUE parsed as JSON when possible (repeatable; with --chat)",
    )
    inp.add_argument("--tokens", type=_token_list, help="send these token ids instead of a prompt (e.g. 2,651,1234)")
    inp.add_argument("--parse-special", action="store_true", help="parse special-token text in the prompt")
    inp.add_argument("--task-id", help="task id to use (default: assigned by the server)")
    smp = gen.add_argument_group("sampling (default: the server's, i.e. greedy)")
    smp.add_argument("--temperature", type=float)
    smp.add_argument("--top-k", type=int)
    smp.add_argument("--top-p", type=float)
    smp.add_argument("--min-p", type=float)
    smp.add_argument("--repetition-penalty", type=float)
    smp.add_argument("--presence-penalty", type=float)
    smp.add_argument("--frequency-penalty", type=float)
    smp.add_argument("--seed", type=int)
    stp = gen.add_argument_group("stopping")
    stp.add_argument("--max-tokens", type=int)
    stp.add_argument("--stop", action="append", help="stop string (repeatable)")
    stp.add_argument("--stop-token-ids", type=_token_list, help="stop token ids (e.g. 1,106)")
    stp.add_argument("--ignore-eos", action="store_true")
    tls = gen.add_argument_group("tools (with --chat)")
    tls.add_argument(
        "--tools",
        type=_json_or_file,
        help="functions the model may call: a JSON file or JSON text, a list of OpenAI tools"
        ' ({"type": "function", "function": {"name", "description", "parameters"}})',
    )
    tls.add_argument(
        "--tool-choice",
        type=_tool_choice,
        metavar="CHOICE",
        help="auto, none, required, or the name of the function to call (default: the server's, auto)",
    )
    tls.add_argument("--no-parallel-tool-calls", action="store_true", help="at most one call per answer")
    tls.add_argument(
        "--no-parse-output", action="store_true", help="raw text: leave reasoning and tool calls in the text"
    )
    cns = gen.add_argument_group("output constraint (at most one)").add_mutually_exclusive_group()
    cns.add_argument(
        "--json-schema",
        type=_json_or_file,
        metavar="SCHEMA",
        help="one JSON value valid for this JSON Schema (a JSON file, or JSON text)",
    )
    cns.add_argument("--json-object", action="store_true", help="one JSON object")
    cns.add_argument("--regex", help="text matching this regular expression")
    cns.add_argument("--grammar", type=_read_file, metavar="FILE", help="text matching this Lark grammar (llguidance)")
    cch = gen.add_argument_group("cache")
    cch.add_argument("--no-cache-prompt", action="store_true", help="evaluate the whole prompt, keep nothing")
    cch.add_argument(
        "--checkpoint-offset", type=int, action="append", help="prompt position to checkpoint at (repeatable)"
    )
    outg = gen.add_argument_group("output")
    outg.add_argument("--json", action="store_true", help="print every event as a JSON line")
    outg.add_argument("--logprobs", action="store_true", help="ask for sampled-token logprobs (shown with --json)")
    outg.add_argument("--top-logprobs", type=int, default=0, help="alternatives per position (shown with --json)")
    outg.add_argument("-q", "--quiet", action="store_true", help="no reasoning and no summary line on stderr")
    gen.set_defaults(func=_run_generate)

    can = subparsers.add_parser(prefix + "cancel", help="cancel a task by id", description="Cancel a task by id.")
    can.add_argument("task_id")
    _add_connection_args(can)
    can.set_defaults(func=_run_cancel)

    sts = subparsers.add_parser(
        prefix + "stats", help="print the cache statistics (JSON)", description="Print the cache statistics as JSON."
    )
    _add_connection_args(sts)
    sts.set_defaults(func=_run_unary("cache_stats"))

    inf = subparsers.add_parser(
        prefix + "model-info", help="print the model description (JSON)", description="Print the model info as JSON."
    )
    _add_connection_args(inf)
    inf.set_defaults(func=_run_unary("model_info"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hyserve_client", description="Client for a running hyserve gRPC server."
    )
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.func
    return handler(args)
