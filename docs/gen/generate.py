"""Writes every generated part of the documentation, or checks that the committed copies are current.

    python3 docs/gen/generate.py            # regenerate
    python3 docs/gen/generate.py --check    # fail, naming the stale files, if a regeneration would change anything

Generated: the reference pages `docs/reference/cli.md` (argparse), `metrics.md` (the `/metrics`
collector) and `grpc-api.md` (the proto, via buf and protoc-gen-doc), and the tables between
`<!-- BEGIN GENERATED name -->` and `<!-- END GENERATED name -->` in README.md, docker/README.md
and docs/*.md, made from `bench/results/*.json` by `bench/report.py`.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench"), str(Path(__file__).resolve().parent)]

import reference  # noqa: E402
import report  # noqa: E402

COMMAND = "python3 docs/gen/generate.py"
PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "cli": ("docs/reference/cli.md", reference.cli_page),
    "metrics": ("docs/reference/metrics.md", reference.metrics_page),
    "grpc-api": ("docs/reference/grpc-api.md", reference.grpc_page),
}
PARTS = (*PAGES, "tables")
BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN GENERATED (?P<name>[a-z0-9-]+)[^>]*-->\n)(?P<body>.*?)"
    r"(?P<end><!-- END GENERATED (?P=name) -->)",
    re.S,
)


def block_files() -> list[Path]:
    pages = {REPO / path for path, _ in PAGES.values()}
    docs = [p for p in sorted((REPO / "docs").rglob("*.md")) if p not in pages]
    return [REPO / "README.md", REPO / "docker" / "README.md", *docs]


def fill_blocks(text: str, blocks: dict[str, str], where: str, used: set[str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in blocks:
            raise SystemExit(f"{where}: unknown generated block {name!r} (known: {', '.join(sorted(blocks))})")
        used.add(name)
        return f"{m['begin']}\n{blocks[name].strip()}\n\n{m['end']}"

    return BLOCK.sub(one, text)


def expected(only: list[str] | None = None) -> dict[str, str]:
    """Relative path -> the content it should have. `only`: some of PARTS (default: all)."""
    parts = set(only or PARTS)
    out = {path: render() for name, (path, render) in PAGES.items() if name in parts}
    if "tables" in parts:
        blocks, used = report.tables(), set()
        for path in block_files():
            text = path.read_text()
            filled = fill_blocks(text, blocks, str(path.relative_to(REPO)), used)
            if BLOCK.search(text):
                out[str(path.relative_to(REPO))] = filled
        unused = sorted(set(blocks) - used)
        if unused:
            raise SystemExit(f"generated tables no page shows: {', '.join(unused)} (add their markers or drop them)")
    return out


def stale(want: dict[str, str]) -> list[str]:
    """Write the expected files into a temp dir and compare them with the repository's."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for rel, content in want.items():
            fresh = Path(tmp) / rel
            fresh.parent.mkdir(parents=True, exist_ok=True)
            fresh.write_text(content)
            have = REPO / rel
            current = have.read_text() if have.exists() else ""
            if current != fresh.read_text():
                diff = difflib.unified_diff(
                    current.splitlines(),
                    content.splitlines(),
                    f"{rel} (committed)",
                    f"{rel} (regenerated)",
                    lineterm="",
                )
                problems.append("\n".join(list(diff)[:40]))
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 if anything is stale")
    ap.add_argument("--only", nargs="+", choices=PARTS, help="just these parts (default: all)")
    args = ap.parse_args(argv)
    try:
        want = expected(args.only)
    except reference.ToolMissing as exc:
        print(f"docs/gen: the gRPC API page needs buf and protoc-gen-doc: {exc}", file=sys.stderr)
        return 2
    if args.check:
        problems = stale(want)
        if problems:
            print("\n\n".join(problems), file=sys.stderr)
            print(f"\nGenerated documentation is stale: run `{COMMAND}` and commit the result.", file=sys.stderr)
            return 1
        print(f"docs/gen: {len(want)} generated files are current")
        return 0
    for rel, content in want.items():
        path = REPO / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != content:
            path.write_text(content)
            print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
