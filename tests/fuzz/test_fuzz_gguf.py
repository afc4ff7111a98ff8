"""Fuzzed GGUF reader and model loader: any file is either used or refused with a GGUFError.

Two hypothesis properties, seeded (derandomized) and bounded:
- the reader (`GGUFFile.open`) over files built from drawn structure (`gguf_strategy`: header,
  metadata of every value type, tensor table, data) plus byte damage;
- the whole loader (`load_model`: reader, architecture, tokenizer, chat template) over the corpus
  models (`corpus/seed-*.gguf`, tiny llama / qwen35 / mamba2) with metadata values replaced by any
  type and value, keys and tensors dropped, tensor shapes, types and offsets changed, and byte
  damage. A model that loads must also evaluate a token, or refuse with a clear error.

Neither may raise anything but GGUFError, hang (a deadline per input), or allocate memory out of
proportion to the file because a header says so (a tracemalloc peak bound). `corpus/regressions/`
holds every input that once broke a property; each is replayed by `test_regressions`.

HYSERVE_FUZZ_EXAMPLES=N runs N inputs per property instead of the CI budget.
"""

from __future__ import annotations

import math
import os
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.gguf_file import GGUFError, GGUFFile
from hyserve.model.loader import load_model

from .gguf_strategy import KV, Damage, GGUFParts, TensorEntry, apply_damage, damage, gguf_bytes, gguf_parts, kvs

pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("error::RuntimeWarning")]

CORPUS = Path(__file__).parent / "corpus"
SEEDS = sorted(CORPUS.glob("seed-*.gguf"))
REGRESSIONS = sorted((CORPUS / "regressions").glob("*.gguf"))
EXAMPLES = int(os.environ.get("HYSERVE_FUZZ_EXAMPLES", "0"))
MEMORY_BOUND = 64 << 20  # bytes a file of at most ~70 KB may make the loader allocate
TRIED: dict[str, int] = {}


def budget(ci_examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or ci_examples,
        derandomize=True,  # seeded: CI runs the same inputs every time
        deadline=5000,  # ms per input: a hang is a failure
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def bounded(fn: Callable[[], object]) -> None:
    """Run fn; allow only GGUFError; fail on an allocation beyond MEMORY_BOUND."""
    tracemalloc.start()
    try:
        fn()
    except GGUFError as exc:
        assert str(exc), "a GGUFError must say what is wrong"
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"allocated {peak >> 20} MiB"


def load_and_step(path: Path) -> None:
    model = load_model(path)
    memory = model.arch.new_memory(16)
    model.arch.forward([Segment(memory, np.asarray([1, 2], dtype=np.int32), Logits.LAST)])


# --- the reader over drawn structure ----------------------------------------------------------------


@budget(1500)
@given(parts=gguf_parts(), hurt=damage)
def test_reader_refuses_or_parses(tmp_path_factory: pytest.TempPathFactory, parts: GGUFParts, hurt: Damage) -> None:
    TRIED["reader"] = TRIED.get("reader", 0) + 1
    path = tmp_path_factory.getbasetemp() / "reader.gguf"
    path.write_bytes(apply_damage(gguf_bytes(parts), hurt))
    bounded(lambda: check_tensors(GGUFFile.open(path)))


def check_tensors(f: GGUFFile) -> None:
    """What a parsed file promises: every tensor's view holds exactly its shape's bytes, in the file."""
    for t in f.tensors.values():
        block, type_size = gguf.GGML_QUANT_SIZES[t.ggml_type]
        assert all(0 <= d < 2**63 for d in t.shape), t.shape
        assert t.data.nbytes == math.prod(t.shape) // block * type_size, (t.name, t.shape, t.data.nbytes)


# --- the loader over mutated real models ----------------------------------------------------------


def parts_of(path: Path) -> GGUFParts:
    """A real file as writer parts (scalars, strings and flat arrays, as the corpus has)."""
    reader = gguf.GGUFReader(path)
    out: list[KV] = []
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            elem = field.types[1]
            if elem == gguf.GGUFValueType.STRING:
                items = [bytes(field.parts[i]) for i in field.data]
            else:
                items = [field.parts[i].tolist()[0] for i in field.data]
            out.append(KV(field.name.encode(), int(vtype), (int(elem), items)))
        elif vtype == gguf.GGUFValueType.STRING:
            out.append(KV(field.name.encode(), int(vtype), bytes(field.parts[field.data[0]])))
        else:
            out.append(KV(field.name.encode(), int(vtype), field.parts[field.data[0]].tolist()[0]))
    data = path.read_bytes()[reader.data_offset :]
    tensors = tuple(
        TensorEntry(
            t.name.encode(), tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset - reader.data_offset
        )
        for t in reader.tensors
    )
    return GGUFParts(kvs=tuple(out), tensors=tensors, data=data)


_SEED_PARTS = {p.name: parts_of(p) for p in SEEDS}


@st.composite
def mutated_model(draw: st.DrawFn) -> bytes:
    parts = _SEED_PARTS[draw(st.sampled_from(sorted(_SEED_PARTS)))]
    kv_list, tensors = list(parts.kvs), list(parts.tensors)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "set", "set", "retype", "drop_kv", "tensor", "drop_tensor"]))
        if op in ("set", "retype", "drop_kv") and kv_list:
            i = draw(st.integers(0, len(kv_list) - 1))
            if op == "drop_kv":
                del kv_list[i]
            elif op == "retype":  # same key, any type and value
                kv_list[i] = replace(draw(kvs()), key=kv_list[i].key)
            else:  # same type, another value (numbers at their edges, arrays resized)
                kv_list[i] = replace(kv_list[i], value=draw(_same_type_value(kv_list[i])))
        elif op == "tensor" and tensors:
            i = draw(st.integers(0, len(tensors) - 1))
            t = tensors[i]
            what = draw(st.sampled_from(["dims", "type", "offset"]))
            if what == "dims":
                t = replace(t, dims=tuple(draw(st.sampled_from([0, 1, 16, 32, 33, 64, 2**32, 2**63])) for _ in t.dims))
            elif what == "type":
                t = replace(t, ggml_type=draw(st.sampled_from([int(x) for x in gguf.GGMLQuantizationType])))
            else:
                t = replace(t, offset=draw(st.sampled_from([0, 1, 32, t.offset + 32, 2**40])))
            tensors[i] = t
        elif op == "drop_tensor" and tensors:
            del tensors[draw(st.integers(0, len(tensors) - 1))]
    raw = gguf_bytes(replace(parts, kvs=tuple(kv_list), tensors=tuple(tensors)))
    if draw(st.integers(0, 3)) == 0:
        raw = apply_damage(raw, draw(damage))
    return raw


def _same_type_value(kv: KV) -> st.SearchStrategy[object]:
    from .gguf_strategy import V, scalar, strings

    if kv.vtype == V.STRING:
        return st.one_of(strings, st.sampled_from([b"", b"llama", b"qwen35", b"mamba2", b"gpt2", b"{{ x.y.z }}"]))
    if kv.vtype == V.ARRAY:
        elem, items = kv.value
        return st.one_of(
            st.just((elem, items[: len(items) // 2])),
            st.just((elem, [])),
            st.just((elem, items + items[:3])),
        )
    return scalar(V(kv.vtype))


@budget(150)
@given(raw=mutated_model())
def test_loader_refuses_or_loads(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    TRIED["loader"] = TRIED.get("loader", 0) + 1
    path = tmp_path_factory.getbasetemp() / "loader.gguf"
    path.write_bytes(raw)
    bounded(lambda: load_and_step(path))


# --- kept inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SEEDS + REGRESSIONS, ids=lambda p: p.name)
def test_corpus(path: Path) -> None:
    """Seeds load and run; every input that once broke a property is refused cleanly."""
    if path in SEEDS:
        load_and_step(path)
    else:
        with pytest.raises(GGUFError):
            bounded_raise(lambda: load_and_step(path))


def bounded_raise(fn: Callable[[], object]) -> None:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MEMORY_BOUND, f"allocated {peak >> 20} MiB"


@pytest.fixture(scope="module", autouse=True)
def report_tried(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nfuzz (GGUF): inputs tried {TRIED}")
