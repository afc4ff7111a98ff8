"""Regenerate the Python code for the public API (proto/hyserve/v1/*.proto) with grpc_tools.protoc.

    python -m hyserve.api.codegen             # rewrite every copy
    python -m hyserve.api.codegen --check     # exit 1 if a committed copy is stale
    python -m hyserve.api.codegen --out DIR   # write one copy to DIR instead (repeatable)

There are two copies of the generated code, both produced here from the same run of protoc:
service/hyserve/api/gen (imported by the server as `hyserve.api.gen`) and
clients/python/hyserve_client/_gen (vendored so that the `hyserve-client` distribution stands alone).

protoc names modules after the proto package (`from hyserve.v1 import hyserve_pb2`); each copy is
flattened into one directory and those imports are rewritten as relative imports, so the same files
work under any package name. The output depends on the grpcio-tools version (its protoc and the
runtime version checks it embeds), so `--check` reports that version when the copies differ.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PROTO_ROOT = REPO_ROOT / "proto"
DEFAULT_OUTPUTS = (
    REPO_ROOT / "service" / "hyserve" / "api" / "gen",
    REPO_ROOT / "clients" / "python" / "hyserve_client" / "_gen",
)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
INIT_TEXT = '''"""Generated protobuf and gRPC code for the hyserve.v1 API (proto/hyserve/v1/).

Do not edit: regenerate with `python -m hyserve.api.codegen` (and verify with `--check`).
"""
'''
# `from hyserve.v1 import hyserve_pb2 as alias` -> `from . import hyserve_pb2 as alias`
_ABSOLUTE_IMPORT = re.compile(r"^from hyserve\.v\d+ import (\w+_pb2)( as \w+)?$", re.MULTILINE)
_GENERATED_VERSION = re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'$", re.MULTILINE)


class CodegenError(RuntimeError):
    """protoc failed, or its output was not what this script expects."""


@dataclass(frozen=True)
class Generated:
    """The files of one copy of the generated code: file name -> text."""

    files: dict[str, str]


def grpc_tools_version() -> str:
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def find_protos(proto_root: Path) -> list[Path]:
    if not proto_root.is_dir():
        raise CodegenError(f"proto root {proto_root} not found (run from a source checkout or pass --proto-root)")
    protos = sorted(p.relative_to(proto_root) for p in proto_root.rglob("*.proto"))
    if not protos:
        raise CodegenError(f"no .proto files under {proto_root}")
    return protos


def run_protoc(proto_root: Path, protos: Sequence[Path], out_dir: Path) -> None:
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise CodegenError("grpcio-tools is not installed (pip install grpcio-tools)") from exc
    import importlib.resources

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in protos),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise CodegenError(f"protoc failed with exit code {rc}: {' '.join(args)}")


def generate(proto_root: Path = DEFAULT_PROTO_ROOT) -> Generated:
    """Run protoc once and return the flattened, import-fixed files of one copy."""
    protos = find_protos(proto_root)
    files: dict[str, str] = {"__init__.py": INIT_TEXT}
    with tempfile.TemporaryDirectory(prefix="hyserve-codegen-") as tmp:
        run_protoc(proto_root, protos, Path(tmp))
        for path in sorted(Path(tmp).rglob("*")):
            if not path.is_file():
                continue
            if not path.name.endswith(GENERATED_SUFFIXES):
                raise CodegenError(f"unexpected protoc output {path.relative_to(tmp)}")
            if path.name in files:
                raise CodegenError(f"two protos generate {path.name}; flattening into one directory would clash")
            files[path.name] = fix_imports(path.read_text(encoding="utf-8"), path.name)
    return Generated(files)


def fix_imports(text: str, name: str) -> str:
    """Turn protoc's package-absolute imports of sibling modules into relative ones."""
    fixed = _ABSOLUTE_IMPORT.sub(lambda m: f"from . import {m.group(1)}{m.group(2) or ''}", text)
    leftover = re.search(r"^(?:from|import) hyserve\.v\d.*$", fixed, re.MULTILINE)
    if leftover:
        raise CodegenError(f"{name}: could not rewrite import {leftover.group(0)!r}")
    return fixed


def write(generated: Generated, out_dir: Path) -> None:
    """Write one copy into out_dir, removing generated files that no longer have a source."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in _generated_names(out_dir) - generated.files.keys():
        (out_dir / stale).unlink()
    for name, text in generated.files.items():
        target = out_dir / name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")


def compare(generated: Generated, out_dir: Path, max_diff_lines: int = 40) -> list[str]:
    """Return one problem description per file of out_dir that differs from `generated`."""
    problems: list[str] = []
    present = _generated_names(out_dir) if out_dir.is_dir() else set()
    for name in sorted(present - generated.files.keys()):
        problems.append(f"{out_dir / name}: stale file (no proto generates it)")
    for name, text in sorted(generated.files.items()):
        target = out_dir / name
        if not target.exists():
            problems.append(f"{target}: missing")
            continue
        committed = target.read_text(encoding="utf-8")
        if committed == text:
            continue
        diff = list(
            difflib.unified_diff(
                committed.splitlines(), text.splitlines(), f"{target} (committed)", f"{name} (regenerated)", lineterm=""
            )
        )
        shown = "\n".join(line[:200] for line in diff[:max_diff_lines])
        more = f"\n... {len(diff) - max_diff_lines} more diff lines" if len(diff) > max_diff_lines else ""
        problems.append(f"{target}: differs from the regenerated file\n{shown}{more}")
    return problems


def _generated_names(out_dir: Path) -> set[str]:
    """Files in out_dir that this script owns."""
    return {p.name for p in out_dir.iterdir() if p.is_file() and p.name.endswith((*GENERATED_SUFFIXES, "__init__.py"))}


def committed_generator_version(out_dir: Path) -> str | None:
    """The grpcio-tools version recorded in a committed *_pb2_grpc.py, if any."""
    for path in sorted(out_dir.glob("*_pb2_grpc.py")) if out_dir.is_dir() else []:
        match = _GENERATED_VERSION.search(path.read_text(encoding="utf-8"))
        if match:
            return match.group(1)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hyserve.api.codegen", description="Regenerate the Python code for proto/hyserve/v1."
    )
    parser.add_argument(
        "--check", action="store_true", help="regenerate into a temporary directory and fail if a copy differs"
    )
    parser.add_argument(
        "--out",
        type=Path,
        action="append",
        help="output directory (repeatable); default: the server's and the client's copies",
    )
    parser.add_argument("--proto-root", type=Path, default=DEFAULT_PROTO_ROOT, help="directory holding hyserve/v1/")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    outputs: list[Path] = args.out or list(DEFAULT_OUTPUTS)
    try:
        generated = generate(args.proto_root)
    except CodegenError as exc:
        print(f"codegen: error: {exc}", file=sys.stderr)
        return 2
    if not args.check:
        for out_dir in outputs:
            write(generated, out_dir)
            print(f"codegen: wrote {len(generated.files)} files to {out_dir}")
        return 0

    problems = [p for out_dir in outputs for p in compare(generated, out_dir)]
    if not problems:
        print(f"codegen: {len(outputs)} copies up to date (grpcio-tools {grpc_tools_version()})")
        return 0
    print("codegen: generated code is out of date:\n", file=sys.stderr)
    print("\n\n".join(problems), file=sys.stderr)
    ours = grpc_tools_version()
    theirs = {v for v in map(committed_generator_version, outputs) if v}
    hint = "Run `python -m hyserve.api.codegen` (PYTHONPATH=service) and commit the result."
    if theirs and theirs != {ours}:
        hint += (
            f" Note: the committed files were generated by grpcio-tools {', '.join(sorted(theirs))} but this"
            f" environment has {ours}; install that version to compare like with like."
        )
    print(f"\n{hint}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
