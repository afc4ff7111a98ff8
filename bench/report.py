"""Where a bench's result goes: `<out>/<name>.json`, `<out>/<name>.png` and the JSON on stdout
(logs go to stderr, so stdout parses as JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def publish(result: dict, out: Path, name: str, draw: Callable[[dict, Path], None], shown: dict | None = None) -> None:
    """Write the JSON and the PNG, and print `shown` (default: the whole result) as JSON."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    draw(result, out / f"{name}.png")
    print(json.dumps(result if shown is None else shown, indent=2))
