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
import resource
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

from .gguf_strategy import KV, Damage, GGUFParts, TensorEntry, V, apply_damage, damage, gguf_bytes, gguf_parts, kvs

pytestmark = pytest.mark.fuzz

CORPUS = Path(__file__).parent / "corpus"
SEEDS = sorted(CORPUS.glob("seed-*.gguf"))
REGRESSIONS = sorted((CORPUS / "regressions").glob("*.gguf"))
EXAMPLES = int(os.environ.get("HYSERVE_FUZZ_EXAMPLES", "0"))
MEMORY_BOUND = 1 << 30  # address space a file of at most ~70 KB may make the loader map (threads' arenas too)
TRIED: Counter[str] = Counter()
SCRATCH = Path(tempfile.mkdtemp(prefix="hyserve-fuzz-"))


def budget(ci_examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or ci_examples,
        derandomize=True,  # seeded: CI runs the same inputs every time
        deadline=5000,  # ms per input: a hang is a failure
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@contextmanager
def address_space_limit(extra: int) -> Iterator[None]:
    """Let the process map at most `extra` more bytes (an absurd allocation fails with MemoryError,
    lazily backed numpy arrays included); cheap enough to wrap every input."""
    vm = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").open() if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def bounded(fn: Callable[[], object]) -> None:
    """Run fn; allow only GGUFError; fail on an allocation beyond MEMORY_BOUND."""
    try:
        with address_space_limit(MEMORY_BOUND):
            fn()
    except GGUFError as exc:
        assert str(exc), "a GGUFError must say what is wrong"
    except MemoryError as exc:
        raise AssertionError(f"the file made the loader map more than {MEMORY_BOUND >> 20} MiB") from exc


def load_and_step(path: Path) -> None:
    model = load_model(path)
    memory = model.arch.new_memory(16)
    model.arch.forward([Segment(memory, np.asarray([1, 2], dtype=np.int32), Logits.LAST)])


# --- the reader over drawn structure ----------------------------------------------------------------


@budget(1000)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # an int64 overflow while sizing a tensor
@given(parts=gguf_parts(), hurt=damage)
def reader_refuses_or_parses(parts: GGUFParts, hurt: Damage) -> None:
    TRIED["reader"] += 1
    path = SCRATCH / "reader.gguf"
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


@budget(250)
@given(raw=mutated_model())
def loader_refuses_or_loads(raw: bytes) -> None:
    TRIED["loader"] += 1
    path = SCRATCH / "loader.gguf"
    path.write_bytes(raw)
    bounded(lambda: load_and_step(path))


# --- kept inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SEEDS + REGRESSIONS, ids=lambda p: p.name)
def test_corpus(path: Path) -> None:
    """Seeds load and run; every input that once broke a property is refused cleanly."""
    if path in SEEDS:
        load_and_step(path)
    else:
        with pytest.raises(GGUFError), address_space_limit(MEMORY_BOUND):
            load_and_step(path)


# Metadata the loader fuzz found crashing the loader, or passing it and failing the first request
# (before the checks in hparams.py and loader.py): (seed, key, value type, value, ...).
S, U32, F32, BOOL, ARR = V.STRING, V.UINT32, V.FLOAT32, V.BOOL, V.ARRAY
METADATA_REGRESSIONS = [  # ..., and what the GGUFError must say
    ("seed-mamba2.gguf", "mamba2.ssm.time_step_rank", U32, 0, "time_step_rank is 0, expected an integer in"),
    ("seed-mamba2.gguf", "mamba2.ssm.inner_size", U32, 1268, "tensors do not match its metadata: cannot reshape"),
    ("seed-qwen35.gguf", "qwen35.full_attention_interval", U32, 0, "full_attention_interval is 0"),
    ("seed-llama.gguf", "llama.attention.head_count", U32, 12836052, "tensors do not match its metadata"),
    ("seed-llama.gguf", "llama.embedding_length", U32, 64, "has 32 elements, expected 64"),
    ("seed-llama.gguf", "llama.attention.key_length", U32, 32, "tensors do not match its metadata"),
    ("seed-llama.gguf", "llama.rope.freq_base", F32, float("nan"), "freq_base is nan, expected a positive finite"),
    # passed the range check and took 130 s in the load-time probe (long run, HYSERVE_FUZZ_EXAMPLES=5000)
    ("seed-qwen35.gguf", "qwen35.rope.dimension_count", U32, 466648049, "dimension_count is 466648049"),
    ("seed-llama.gguf", "llama.context_length", S, b"4096", "context_length is '4096', expected an integer"),
    ("seed-llama.gguf", "tokenizer.ggml.tokens", BOOL, 1, "unusable tokenizer metadata"),
    ("seed-llama.gguf", "tokenizer.ggml.token_type", ARR, (int(V.INT32), []), "unusable tokenizer metadata"),
    ("seed-llama.gguf", "tokenizer.ggml.pre", S, b"bos", "unsupported tokenizer.ggml.pre 'bos'"),
    ("seed-llama.gguf", "tokenizer.chat_template", S, b"{% for %}", "unusable tokenizer.chat_template"),
]


@pytest.mark.parametrize(("seed", "key", "vtype", "value", "says"), METADATA_REGRESSIONS, ids=lambda v: str(v)[:40])
def test_metadata_regressions(seed: str, key: str, vtype: V, value: object, says: str) -> None:
    parts = _SEED_PARTS[seed]
    kv = KV(key.encode(), int(vtype), value)
    kept = tuple(k for k in parts.kvs if k.key != kv.key)
    path = SCRATCH / "regression.gguf"
    path.write_bytes(gguf_bytes(replace(parts, kvs=(*kept, kv))))
    with pytest.raises(GGUFError) as refused:
        load_and_step(path)
    assert says in str(refused.value)


def test_reader_refuses_or_parses(capsys: pytest.CaptureFixture[str]) -> None:
    reader_refuses_or_parses()
    with capsys.disabled():
        print(f"\nfuzz: GGUF reader, {TRIED['reader']} inputs, no crash")


def test_loader_refuses_or_loads(capsys: pytest.CaptureFixture[str]) -> None:
    loader_refuses_or_loads()
    with capsys.disabled():
        print(f"\nfuzz: model loader, {TRIED['loader']} inputs, no crash")
