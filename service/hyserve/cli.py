"""`hyserve` command line: `generate` runs the model in-process (no server needed); `serve` runs the
gRPC server."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hyserve.logging_setup import configure_logging
from hyserve.model.backend.select import add_device_arguments


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="GGUF path, or 'default' (Gemma 3 270M from PyPI)")
    p.add_argument("--threads", type=int, default=2, help="kernel threads")
    p.add_argument("--ctx-size", type=int, default=4096)
    p.add_argument("--chat-template", type=Path, default=None, help="Jinja file overriding the model's template")
    add_device_arguments(p)


def _generate(args: argparse.Namespace) -> int:
    import hyserve_kernels

    from hyserve.engine.generator import StopRule, generate
    from hyserve.engine.sampling import SamplingParams
    from hyserve.model.loader import load_model

    hyserve_kernels.set_num_threads(args.threads)
    model = load_model(args.model, args.chat_template, args.device, args.gpu_backend, args.gpu_adapter)
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
    for item in generate(model, prompt, params, stop, n_ctx=args.ctx_size):
        sys.stdout.write(item.text)
        sys.stdout.flush()
        n += 1
        reason = item.finish_reason
    elapsed = time.perf_counter() - start
    sys.stdout.write("\n")
    print(f"[{n} tokens, {n / elapsed:.1f} tok/s incl. prompt of {len(prompt)}, finish: {reason}]", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyserve", description="gRPC inference service for GGUF models")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("run", help="generate text in-process, without a server")
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
    gen.set_defaults(func=_generate)

    from hyserve.api.server import add_serve_subcommand

    add_serve_subcommand(sub)
    # generate / cancel / stats / model-info talk to a running server (the hyserve-client CLI)
    from hyserve_client.cli import add_subcommands

    add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
