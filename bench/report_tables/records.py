"""Result files and their provenance, for the generated benchmark tables (`bench/report.py`).

A result's machine, date, commit and instruction sets come from the JSON file when it records them,
otherwise from `bench/results/runs.toml`; a field neither gives is shown as "—", never guessed.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
NONE = "—"

SIMD_NAMES = {"avx512vnni": "AVX-512 VNNI", "avx2": "AVX2", "scalar": "scalar"}


def llama_isa(system_info: str | None) -> str:
    """The widest x86 vector extension a llama.cpp build reports in `llama_print_system_info`."""
    if not system_info:
        return NONE
    flags = set(re.findall(r"(\w+) = 1", system_info))
    for flag, name in (("AVX512", "AVX-512"), ("AVX2", "AVX2"), ("AVX", "AVX")):
        if flag in flags:
            return name
    return NONE


@dataclass(frozen=True)
class Run:
    """One result file and where it was measured."""

    name: str  # the file name without .json
    data: dict
    machine: str
    date: str
    commit: str
    hyserve_isa: str
    llama_isa: str

    @property
    def isa(self) -> str:
        """`hyserve / llama.cpp` instruction sets, or hyserve's alone when llama.cpp did not run."""
        if self.llama_isa == NONE:
            return self.hyserve_isa
        return f"{self.hyserve_isa} / {self.llama_isa}"

    @property
    def same_isa(self) -> bool:
        return self.hyserve_isa != NONE and self.hyserve_isa == self.llama_isa


class Results:
    """The result files of one folder with their run records."""

    def __init__(self, directory: Path = RESULTS) -> None:
        self.directory = directory
        record_file = directory / "runs.toml"
        doc = tomllib.loads(record_file.read_text()) if record_file.exists() else {}
        machines: dict[str, str] = doc.get("machines", {})
        self.records: dict[str, dict] = {}
        for entry in doc.get("run", []):
            fields = {k: v for k, v in entry.items() if k != "files"}
            if "machine" in fields:
                fields["machine"] = machines[fields["machine"]]
            for name in entry["files"]:
                if name in self.records:
                    raise ValueError(f"{record_file}: {name} is listed twice")
                self.records[name] = fields

    def names(self, prefix: str) -> list[str]:
        """Result files whose name starts with `prefix`, sorted."""
        return sorted(p.stem for p in self.directory.glob(f"{prefix}*.json"))

    def run(self, name: str) -> Run:
        data = json.loads((self.directory / f"{name}.json").read_text())
        record = self.records.get(name, {})
        prov = data.get("provenance") or {}
        date = data.get("date") or prov.get("date_utc") or record.get("date") or NONE
        simd = data.get("hyserve_simd") or prov.get("hyserve_simd") or record.get("hyserve_simd")
        return Run(
            name=name,
            data=data,
            machine=prov.get("cpu") or record.get("machine") or NONE,
            date=date,
            commit=prov.get("commit") or record.get("commit") or NONE,
            hyserve_isa=SIMD_NAMES.get(simd, simd) if simd else NONE,
            llama_isa=llama_isa(data.get("llama_cpp_cpu")),
        )

    def runs(self, names: Iterable[str]) -> list[Run]:
        return [self.run(n) for n in names]


# --- formatting -----------------------------------------------------------------------------------


def num(x: float | None, digits: int = 1) -> str:
    return NONE if x is None else f"{x:,.{digits}f}"


def ratio(x: float | None) -> str:
    return NONE if x is None else f"{x:.2f}x"


def sci(x: float | None) -> str:
    """A small non-negative number (a KL divergence): 0, or two significant digits."""
    if x is None:
        return NONE
    return "0" if x == 0 else f"{x:.1e}"


def pct(x: float | None, digits: int = 1) -> str:
    return NONE if x is None else f"{100 * x:.{digits}f}%"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def runs_table(runs: Sequence[Run]) -> str:
    """Where each run of a table was measured: the table's provenance."""
    return table(
        ["result file", "machine", "ISA (hyserve / llama.cpp)", "date", "commit"],
        ([f"`{r.name}`", r.machine, r.isa, r.date, r.commit] for r in runs),
    )


def joined(values: Iterable[str]) -> str:
    """The distinct values in their first order, joined."""
    out: list[str] = []
    for v in values:
        if v not in out:
            out.append(v)
    return "; ".join(out)


def provenance_line(label: str, runs: Sequence[Run]) -> str:
    return (
        f"**{label}**: machine {joined(r.machine for r in runs)}; ISA (hyserve / llama.cpp) "
        f"{joined(r.isa for r in runs)}; date {joined(r.date for r in runs)}; commit {joined(r.commit for r in runs)}; "
        f"files {', '.join(f'`{r.name}`' for r in runs)}."
    )


def model_name(raw: str | None) -> str:
    """A display name for the model field of a result."""
    if not raw:
        return NONE
    low = raw.lower()
    if "gemma" in low:
        return "Gemma 3 270M Q4_K_M"
    if "qwen35" in low:
        return "realistic qwen35 (0.8B-shaped, Q4_K_M)"
    if "mamba2" in low:
        return "tiny mamba2 fixture (q8_0)"
    return raw
