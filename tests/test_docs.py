"""The documentation: generated pages and tables are current, their provenance comes from the
result files, and no project text talks about how the project was developed.

Regenerate what these tests compare with `python3 docs/gen/generate.py`. The site itself is built
by `.ci/test.sh` (`mkdocs build --strict`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "gen" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def _assert_current(parts: list[str]) -> None:
    problems = GEN.stale(GEN.expected(parts))
    detail = "\n\n".join(problems)
    assert not problems, f"stale generated documentation; run `{GEN.COMMAND}` and commit the result:\n{detail}"


@pytest.mark.parametrize("part", ["cli", "metrics", "tables"])
def test_generated_documentation_is_current(part: str) -> None:
    _assert_current([part])


def test_grpc_api_reference_is_current() -> None:
    missing = GEN.reference.missing_grpc_tools()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/install.sh --test installs them)")
    _assert_current(["grpc-api"])


def test_a_stale_block_is_reported(tmp_path: Path) -> None:
    text = "intro\n<!-- BEGIN GENERATED demo: x -->\nold table\n<!-- END GENERATED demo -->\nend\n"
    used: set[str] = set()
    filled = GEN.fill_blocks(text, {"demo": "| new |"}, "page.md", used)
    assert filled == "intro\n<!-- BEGIN GENERATED demo: x -->\n\n| new |\n\n<!-- END GENERATED demo -->\nend\n"
    assert used == {"demo"}
    with pytest.raises(SystemExit, match="unknown generated block 'demo'"):
        GEN.fill_blocks(text, {}, "page.md", set())


def test_provenance_comes_from_the_result_then_the_record(tmp_path: Path) -> None:
    from report_tables.records import NONE, Results  # bench/, on sys.path since the generator's import

    base = {"model": "gemma-3-270m-q4_k_m.gguf", "hyserve_simd": "avx2", "llama_cpp_cpu": "CPU : AVX2 = 1 |"}
    (tmp_path / "bare.json").write_text(json.dumps(base))
    (tmp_path / "recorded.json").write_text(json.dumps(base))
    stamped = {**base, "provenance": {"date_utc": "2026-12-01 10:00 UTC", "commit": "abc1234", "cpu": "CPU X"}}
    (tmp_path / "stamped.json").write_text(json.dumps(stamped))
    (tmp_path / "runs.toml").write_text(
        '[machines]\nvm = "a VM"\n\n[[run]]\nfiles = ["recorded", "stamped"]\nmachine = "vm"\n'
        'date = "2026-11-01"\ncommit = "1111111"\n'
    )
    results = Results(tmp_path)
    bare, recorded, stamp = (results.run(n) for n in ("bare", "recorded", "stamped"))
    assert (bare.machine, bare.date, bare.commit) == (NONE, NONE, NONE)
    assert (recorded.machine, recorded.date, recorded.commit) == ("a VM", "2026-11-01", "1111111")
    assert (stamp.machine, stamp.date, stamp.commit) == ("CPU X", "2026-12-01 10:00 UTC", "abc1234")
    assert bare.isa == "AVX2 / AVX2" and bare.same_isa


def test_the_gpu_table_puts_each_llama_cpp_build_in_its_column() -> None:
    """A GPU run names its llama.cpp builds by backend (CUDA, Vulkan); runs from before the Vulkan
    side hold one, CUDA, as the side itself: both read into the same columns."""
    from report_tables.speed import _gpu_side

    side = {"prompt_tokens": 512, "prompt_tok_s": 1000.0, "gen_tokens": 64, "gen_tok_s": 50.0}
    side["batched_decode_step_s"] = {"1": 0.02}
    cuda = {"prompt_tok_s": 4000.0, "gen_tok_s": 400.0, "batched_decode_step_s": {"1": 0.0025}}
    vulkan = {"prompt_tok_s": 3000.0, "gen_tok_s": 300.0, "batched_decode_step_s": {"1": 0.003}}
    both = _gpu_side("m", {**side, "llama_cpp_same_device": {"cuda": cuda, "vulkan": vulkan}})
    assert [row[2:] for row in both] == [
        ["1,000.0", "4,000.0", "3,000.0"],
        ["50.0", "400.0", "300.0"],
        ["20.0", "2.5", "3.0"],
    ]
    older = _gpu_side("m", {**side, "llama_cpp_same_device": cuda})
    assert [row[2:] for row in older] == [[a, b, "—"] for a, b, _ in (row[2:] for row in both)]
    assert [row[3:] for row in _gpu_side("m", side)] == [["—", "—"]] * 3


# --- no process-speak -----------------------------------------------------------------------------

PROCESS_SPEAK = re.compile(
    r"""(?ix)
      \bsessions?\s+\d+                                   # session 16, sessions 11-15
    | \b(?:this|previous|earlier|later|next|last|current|each|one|a\ gpu|the\ same)\s+sessions?\b
      (?!\s*(?:id|header|affinity|token|cookie))
    | \bissues?\s+\#?\d+ | \(issue\b                       # issue 12, (issue ...)
    | \bthe\ issue's\b | \b(?:in|of)\ the\ issue\b
    | \bwork\ items?\s+\d | \bwave\s+\d+
    | \b(?:lent|borrowed|leased)\s+(?:machines?|gpus?|h100|h200|vms?)\b | \ba\ lent\b | \blease\b
    | \bsub-?agents?\b | \bhelper\ (?:agents?|sessions?)\b | \bother\ engineers?\b | \bthe\ brief\b
    """
)


def _project_files() -> list[str]:
    proc = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"git ls-files failed: {proc.stderr}"
    skip = re.compile(r"^bench/results/.*\.json$|^tests/test_docs\.py$")
    return [f for f in proc.stdout.splitlines() if f and not skip.match(f)]


def test_no_project_text_talks_about_how_it_was_developed() -> None:
    hits = []
    for name in _project_files():
        path = REPO / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files, or deleted in the working tree
        for number, line in enumerate(text.splitlines(), 1):
            match = PROCESS_SPEAK.search(line)
            if match:
                hits.append(f"{name}:{number}: {match.group(0)!r} in {line.strip()[:100]!r}")
    assert not hits, "text about the development process (say what the code does instead):\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "text",
    [
        "measured in session 16",
        "sessions 11-15 ran on Zen 4",
        "(issue 14, item 3)",
        "issue 12's bars",
        "the issue's ~100 ms",
        "work item 5",
        "wave 2",
        "on a lent machine",
        "a lent H200",
        "the lease's 30 minutes",
        "Left for a GPU session",
        "before this session's changes",
        "other engineers' builds",
    ],
)
def test_process_speak_is_caught(text: str) -> None:
    assert PROCESS_SPEAK.search(text), text


@pytest.mark.parametrize(
    "text",
    [
        "a gRPC session",
        "an HTTP session",
        "x-session-id",
        "one session id per conversation",
        "session affinity first",
        'scope="session"',
        "nine agent conversations",
        "a work item of 4 heads",
        "an issue with the driver",
        "released with the cancel",
        "the tests' references",
    ],
)
def test_product_words_are_not_process_speak(text: str) -> None:
    assert not PROCESS_SPEAK.search(text), text
