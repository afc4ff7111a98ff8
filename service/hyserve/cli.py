"""`hyserve` command line: `generate` runs the model in-process (no server needed); `serve` runs the
gRPC server."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hyserve.device_flags import add_device_arguments, device_request
from hyserve.logging_setup import configure_logging
from hyserve.operator_errors import OperatorError, model_path_error, run_flag_error, run_reporting
from hyserve.spec_flags import add_spec_arguments, spec_config, spec_flag_error


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="GGUF path, or 'default' (Gemma 3 270M from PyPI)")
    p.add_argument("--threads", type=int, default=2, help="kernel threads")
    p.add_argument("--ctx-size", type=int, default=4096)
    p.add_argument("--chat-template", type=Path, default=None, help="Jinja file overriding the model's template")
    add_device_arguments(p)


def _generate(args: argparse.Namespace) -> int:
    import hyserve_kernels

    from hyserve.engine.generator import SpecStats, StopRule, generate
    from hyserve.engine.sampling import SamplingParams
    from hyserve.model.loader import load_model

    problem = (
        run_flag_error(args)
        or model_path_error(args.model)
        or spec_flag_error(args.spec, args.spec_draft_model, args.spec_draft_p_min)
    )
    if problem is not None:
        raise OperatorError(problem)
    hyserve_kernels.set_num_threads(args.threads)
    model = load_model(args.model, args.chat_template, device_request(args))
    if args.chat:
        rendered = model.chat_template.render([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
        prompt = model.tokenizer.encode(rendered.text, add_special=False, parse_special=True)
    else:
        prompt = model.tokenizer.encode(args.prompt, add_special=True, parse_special=False)
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    stop = StopRule(max_tokens=args.max_tokens, stop_strings=tuple(args.stop or ()))
    start = time.perf_counter()
    n, reason = 0, None
    if not args.chat:
        sys.stdout.write(args.prompt)
    config = spec_config(
        args.spec,
        args.spec_max_draft,
        args.spec_draft_model,
        model.arch,
        model.tokenizer,
        device_request(args),
        args.spec_draft_p_min,
    )
    spec = config if config.method != "off" else None
    stats = SpecStats()
    for item in generate(model, prompt, params, stop, n_ctx=args.ctx_size, spec=spec, spec_stats=stats):
        sys.stdout.write(item.text)
        sys.stdout.flush()
        n += 1
        reason = item.finish_reason
    elapsed = time.perf_counter() - start
    sys.stdout.write("\n")
    drafts = f", drafted {stats.drafted}, accepted {stats.accepted}" if spec is not None else ""
    print(
        f"[{n} tokens, {n / elapsed:.1f} tok/s incl. prompt of {len(prompt)}, finish: {reason}{drafts}]",
        file=sys.stderr,
    )
    return 0


def _hash_token(args: argparse.Namespace) -> int:
    from hyserve.api.auth import hash_token, new_token_line

    if args.stdin:  # an existing token, e.g. from a secret manager
        token = sys.stdin.readline().strip()
        if not token:
            raise OperatorError("no token on standard input")
        print(f"{args.name} {hash_token(token)}" + (" admin" if args.admin else ""))
        return 0
    try:
        token, line = new_token_line(args.name, args.admin)
    except ValueError as exc:
        raise OperatorError(str(exc)) from exc
    print(line)
    print(token, file=sys.stderr)
    return 0


def _add_debug(p: argparse.ArgumentParser, default: object) -> None:
    p.add_argument("--debug", action="store_true", default=default, help="show tracebacks for operator errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyserve", description="gRPC inference service for GGUF models")
    _add_debug(parser, False)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("run", help="generate text in-process, without a server")
    _add_debug(gen, argparse.SUPPRESS)
    gen.add_argument("prompt")
    _add_model_args(gen)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument(
        "--chat", action="store_true", help="treat the prompt as a user message and apply the chat template"
    )
    add_spec_arguments(gen)
    gen.set_defaults(func=_generate)

    from hyserve.api.server import add_serve_subcommand

    _add_debug(add_serve_subcommand(sub), argparse.SUPPRESS)
    tok = sub.add_parser(
        "hash-token",
        help="print a token-file line for --auth-token-file (stdout) and the new token (stderr)",
    )
    tok.add_argument("name", help="principal name")
    tok.add_argument("--admin", action="store_true", help="this principal sees and may cancel every task")
    tok.add_argument("--stdin", action="store_true", help="hash the token read from standard input instead")
    tok.set_defaults(func=_hash_token)
    # generate / cancel / stats / model-info talk to a running server (the hyserve-client CLI)
    from hyserve_client.cli import add_subcommands

    add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    return int(run_reporting(args.command, args.func, args))


if __name__ == "__main__":
    raise SystemExit(main())
