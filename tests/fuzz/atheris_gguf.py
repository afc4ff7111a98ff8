"""Coverage-guided fuzzing of the GGUF reader and loader with atheris (optional, not run in CI).

    pip install --target /tmp/atheris-site atheris     # a private dir; CI does not need it
    mkdir -p /tmp/gguf-corpus && PYTHONPATH=/tmp/atheris-site:service:tests python3 -m fuzz.atheris_gguf \\
        -atheris_runs=100000 -max_len=70000 /tmp/gguf-corpus tests/fuzz/corpus tests/fuzz/corpus/regressions

libFuzzer mutates the corpus files (the seed models and the regressions) guided by line coverage
of `hyserve.model` and writes what it finds to the first directory (keep that one outside the
repository); anything but a GGUFError is a crash (the input is written to crash-*).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["hyserve.model"]):
    from hyserve.model.gguf_file import GGUFError
    from hyserve.model.loader import load_model

SCRATCH = Path(tempfile.mkdtemp(prefix="hyserve-atheris-")) / "input.gguf"


def one_input(data: bytes) -> None:
    SCRATCH.write_bytes(data)
    try:
        load_model(SCRATCH)
    except GGUFError:
        pass


def main() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
