"""Structural rules that keep the layers honest: what a module may load, and how tests import our code."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# modules that mean a model, a tokenizer or the kernel wheel was loaded
HEAVY = ("hyserve.model", "hyserve_kernels", "tokenizers", "hyserve.engine.generator", "hyserve.engine.engine")


def loaded_after_import(module: str) -> list[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.split()


def test_cache_plan_loads_no_model_tokenizer_or_kernel() -> None:
    """cache_plan promises "no model, no memory, no threads": importing it must not load them."""
    loaded = loaded_after_import("hyserve.engine.cache_plan")
    assert "hyserve.engine.cache_plan" in loaded
    heavy = [m for m in loaded if m.startswith(HEAVY)]
    assert heavy == [], f"importing cache_plan loaded {heavy}"


def test_cache_plan_modules_import_only_each_other() -> None:
    """The decision modules of the cache_plan package (resume, admission, placement, budgets, kinds)
    import nothing of hyserve outside that package: no engine state, no model, no threads."""
    package = TESTS.parent / "service" / "hyserve" / "engine" / "cache_plan"
    modules = sorted(package.glob("*.py"))
    assert {p.stem for p in modules} >= {"__init__", "kinds", "resume", "admission", "placement", "budgets"}
    outside = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            outside += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("hyserve", "hyserve_kernels")]
    assert [o for o in outside if not o.split(": ")[1].startswith("hyserve.engine.cache_plan")] == []


def test_stop_rules_load_no_model_tokenizer_or_kernel() -> None:
    loaded = loaded_after_import("hyserve.engine.stop")
    assert [m for m in loaded if m.startswith(HEAVY)] == []


def test_tests_import_our_own_code_for_real() -> None:
    """A broken fixture builder (or any module of ours) must fail the tests, not skip them."""
    ours = re.compile(r"importorskip\(\s*[\"'](fixtures|hyserve|llama_oracle|server_process|loopback)\b")
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(TESTS.rglob("*.py"))  # subpackages too (tokenizer/, server/, soak/, ...)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ours.search(line)
    ]
    assert offenders == []


SERVICE = TESTS.parent / "service" / "hyserve"


def test_no_assert_statements_in_the_service() -> None:
    """Invariant checks must survive `python -O`, which strips `assert` statements."""
    found = []
    for path in sorted(SERVICE.rglob("*.py")):
        if "gen" in path.relative_to(SERVICE).parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        asserts = [node for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        found += [f"{path.relative_to(SERVICE)}:{node.lineno}" for node in asserts]
    assert found == []


def test_slot_invariant_holds_under_python_O() -> None:
    """Under -O, a slot whose tokens and memory disagree after a commit still raises (I1)."""
    code = (
        "from hyserve.engine.slot import Slot\n"
        "from hyserve.engine.guards import InvariantError\n"
        "from hyserve.model.memory import SequenceMemory\n"
        "slot = Slot(0, SequenceMemory(8, {}))\n"
        "try:\n"
        "    slot.commit([1, 2])\n"
        "except InvariantError as exc:\n"
        "    print('raised', exc)\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("raised slot 0: 2 tokens but memory holds 0")


def _declared_dependencies(pyproject: Path) -> set[str]:
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    extras = [d for name, deps in project.get("optional-dependencies", {}).items() if name != "test" for d in deps]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0] for d in [*project["dependencies"], *extras]}
    return {n.lower().replace("_", "-") for n in names}


def _imported_top_modules(root: Path) -> set[str]:
    out: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out


def test_every_module_the_service_imports_is_a_declared_dependency() -> None:
    """`pip install` of the service gives a working `hyserve` command: each third-party module it
    imports (hyserve_client for the CLI's server subcommands included) comes from a distribution
    that pyproject.toml declares (or an optional extra other than `test` does, as `default-model`)."""
    declared = _declared_dependencies(TESTS.parent / "pyproject.toml")
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(_imported_top_modules(SERVICE)):
        if module == "hyserve" or module in sys.stdlib_module_names:
            continue
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not dists & declared:
            missing.append(f"{module} (from {sorted(dists) or 'no installed distribution'})")
    assert missing == []


BENCH = TESTS.parent / "bench"


def _tests_modules_imported_by(path: Path) -> set[str]:
    """Top-level names `path` imports (anywhere in it) that are modules or packages of tests/."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if (TESTS / f"{n}.py").exists() or (TESTS / n / "__init__.py").exists()}


def test_bench_imports_the_test_helpers_as_an_installed_package() -> None:
    """bench/ edits no sys.path: what it takes from tests/ comes from the hyserve-test-support
    distribution (tests/pyproject.toml), which must declare each of those modules and what they import."""
    scripts = sorted(BENCH.rglob("*.py"))
    assert [str(p.relative_to(BENCH)) for p in scripts if "sys.path" in p.read_text()] == []
    tool = tomllib.loads((TESTS / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(tool["py-modules"]) | set(tool["packages"])
    needed = set().union(*(_tests_modules_imported_by(p) for p in scripts))
    assert needed, "bench/ imports nothing from tests/: drop tests/pyproject.toml"
    seen: set[str] = set()
    while needed - seen:  # and what those modules import from tests/ in turn
        name = min(needed - seen)
        seen.add(name)
        module = TESTS / f"{name}.py" if (TESTS / f"{name}.py").exists() else TESTS / name / "__init__.py"
        files = [module] if module.name != "__init__.py" else list(module.parent.glob("*.py"))
        needed |= set().union(*(_tests_modules_imported_by(f) for f in files))
    assert sorted(needed - declared) == []


def test_chat_parsing_imports_nothing_of_ours_outside_it() -> None:
    """hyserve.chat is pure text parsing: no model, engine, API or kernel behind it."""
    loaded = loaded_after_import("hyserve.chat")
    ours = [m for m in loaded if m.startswith(("hyserve.", "hyserve_kernels")) and not m.startswith("hyserve.chat")]
    assert ours == []
