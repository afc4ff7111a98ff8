"""Every fixture architecture in every weight format the fixtures make, GPU path against CPU path
teacher-forced in fast numerics: mean KL <= 1e-3 and top-1 >= 99 % (near-ties counted as in
test_gpu_models). The
fixtures of test_gpu_models / test_gpu_hybrid_models cover the shapes; this covers the product of
architectures and formats (`python bench/gpu_agreement.py --matrix` prints the same as a table)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures import make_models
from test_gpu_hybrid_models import CASES as HYBRID_CASES
from test_gpu_models import CASES, TEXT, assert_close_to_cpu, fresh, noise_tie

from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES, load_model

# K-quant blocks are 256 wide: rows of 256 so the fixture's tensors take the K-quant formats
_K_SHAPE = {"embd": 256, "ff": 512, "head_dim": 64}
MATRIX_QTYPES: dict[str, dict] = {"f32": {}, "f16": {}, "q8_0": {}, "q4_k_m": _K_SHAPE, "q6_k": _K_SHAPE}
MATRIX_CASES = [(arch, qtype, kw) for arch in make_models.ARCHES for qtype, kw in MATRIX_QTYPES.items()]
# the cases test_gpu_models / test_gpu_hybrid_models already check (at several prompt lengths)
UNCOVERED = [case for case in MATRIX_CASES if case not in CASES + HYBRID_CASES]


@pytest.mark.parametrize(("arch", "qtype", "kw"), UNCOVERED, ids=[f"{a}-{q}" for a, q, _ in UNCOVERED])
def test_every_architecture_and_format_agrees_with_the_cpu(tmp_path: Path, gpu_fast_backend, arch, qtype, kw) -> None:
    path = make_models.write_model(tmp_path / f"{arch}-{qtype}.gguf", arch, qtype=qtype, **kw)
    cpu = load_model(path)
    gpu = ARCHITECTURES[arch](GGUFFile.open(path), gpu_fast_backend)
    tokens = cpu.tokenizer.encode(TEXT)
    assert_close_to_cpu(fresh(cpu.arch, tokens), fresh(gpu, tokens), noise_tie(cpu, tokens))
