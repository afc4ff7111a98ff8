"""Random fixture specifications for the fidelity fuzz: a pure function of (seed, index), so a
failing case is rebuilt exactly from the two numbers in its id."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from .writer import INDEPENDENT_ARCHES, Shape

ARCHES = ("llama", "qwen2", "qwen3", "gemma3", "qwen35", "qwen35moe", "qwen3next", "mamba2")
BUILDER_ARCHES = ("llama", "qwen3", "qwen35", "qwen35moe", "qwen3next", "mamba2")
KQUANTS = ("q4_k_m", "q5_k_m", "q6_k")
# the types hyserve claims to follow llama.cpp's plain path in bit for bit
BIT_IDENTICAL = ("q8_0", "q4_0", "q5_0", *KQUANTS)


@dataclass(frozen=True)
class Fixture:
    seed: int
    index: int
    arch: str
    qtype: str
    writer: str  # "independent" (writer.py + llama.cpp's quantizer) or "builder" (tests/fixtures)
    shape: Shape | None = None  # independent writer
    builder_kw: dict[str, Any] = field(default_factory=dict)  # builder
    n_merges: int = 0  # independent writer's vocabulary
    text_lengths: tuple[int, ...] = ()  # characters per text

    @property
    def claims_bits(self) -> bool:
        """Whether hyserve claims llama.cpp's logits bit for bit here: the quantized types, except
        a MoE whose F32 router has a multiple of 4 rows, which llama.cpp's batched path multiplies
        with tinyBLAS (its single-token path, which hyserve follows, uses ggml_vec_dot_f32)."""
        if self.qtype not in BIT_IDENTICAL:
            return False
        return self.builder_kw.get("n_expert", 1) % 4 != 0 or self.builder_kw.get("n_expert_used", 1) == 1

    @property
    def id(self) -> str:
        return f"{self.seed}-{self.index}-{self.arch}-{self.qtype}-{self.writer[:3]}"


def _heads(r: random.Random, kquant: bool) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim); K-quant fixtures keep heads * head_dim = 256 so attn_output
    rows are whole K-quant blocks."""
    if kquant:
        heads = r.choice([2, 4, 8])
        return heads, r.choice([k for k in (1, 2, 4, 8) if heads % k == 0]), 256 // heads
    heads = r.choice([1, 2, 3, 4, 6])
    kv = r.choice([k for k in (1, 2, 3, 4, 6) if heads % k == 0])
    return heads, kv, r.choice([8, 16, 32, 64])


def _sections(r: random.Random, n_pairs: int) -> tuple[int, int, int, int]:
    cuts = sorted(r.randint(0, n_pairs) for _ in range(3))
    s = [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], n_pairs - cuts[2]]
    if r.random() < 0.6:  # published Qwen3.5 sections leave the fourth (image) axis empty
        s = [s[0] + s[3], s[1], s[2], 0]
    if s[0] + s[1] + s[2] == 0:  # llama.cpp's IMROPE aborts (GGML_ASSERT) without a text axis
        s = [s[3], 0, 0, 0]
    return s[0], s[1], s[2], s[3]


def _texts(r: random.Random) -> tuple[int, ...]:
    n = r.choice([3, 4, 5])
    short, long = [20, 80, 200, 400, 700], [1500, 3000, 5000]
    return tuple(r.choice(short) if r.random() < 0.85 else r.choice(long) for _ in range(n))


def draw(seed: int, index: int) -> Fixture:
    r = random.Random(f"fidelity-{seed}-{index}")
    arch = ARCHES[index % len(ARCHES)] if index < 2 * len(ARCHES) else r.choice(ARCHES)
    independent = arch in INDEPENDENT_ARCHES and (arch not in BUILDER_ARCHES or r.random() < 0.5)
    if independent:
        qtypes, weights = ["f32", "f16", "q8_0", *KQUANTS, "q4_0", "q5_0", "bf16"], [2, 2, 4, 1.5, 1, 1.5, 1, 1, 0.7]
    else:  # the project's builder makes the K-quants it names (make_models.KQUANT_FTYPES)
        qtypes, weights = ["f32", "f16", "q8_0", "q4_k_m", "q6_k"], [2, 2, 4, 2, 1.5]
    qtype = r.choices(qtypes, weights)[0]
    kq = qtype in KQUANTS or (qtype in ("q4_0", "q5_0") and r.random() < 0.5)
    embd = 256 if kq else r.choice([32, 64, 96, 128, 160])
    ff = r.choice([256, 512]) if kq else r.choice([32, 64, 96, 128, 192, 256])
    layers = r.randint(1, 5)
    heads, kv, hd = _heads(r, kq)
    texts = _texts(r)
    if independent:
        if arch == "qwen35":
            hd = r.choice([8, 16, 32, 64])
            n_rot = r.choice([n for n in (4, 8, 16, 32, 64) if n <= hd])
            interval = r.choice([2, 3, 4])  # at least one attention layer (llama.cpp aborts without)
            shape = Shape(
                arch, r.randint(interval, 8), embd, ff, heads, kv, hd, tie=r.random() < 0.3, n_rot=n_rot,
                sections=_sections(r, n_rot // 2), interval=interval, d_conv=r.choice([2, 3, 4, 5]),
                d_state=r.choice([16, 32, 64]), n_group=(g := r.choice([1, 2, 4])), dt_rank=g * r.choice([1, 2]),
                rope_base=r.choice([1e4, 1e6, 1e7]),
            )  # fmt: skip
        elif arch == "gemma3":
            shape = Shape(arch, r.randint(1, 8), embd, ff, heads, kv, hd, tie=True, window=r.choice([4, 16, 64, 256]),
                          rope_base=1e6)  # fmt: skip
        else:
            if arch == "qwen2":  # llama.cpp's qwen2 needs heads * head_dim == embd
                heads = r.choice([h for h in (1, 2, 4, 8) if embd % h == 0 and (embd // h) % 2 == 0])
                kv, hd = r.choice([k for k in (1, 2, 4, 8) if heads % k == 0]), embd // heads
            shape = Shape(arch, layers, embd, ff, heads, kv, hd, tie=r.random() < 0.3,
                          rope_base=r.choice([1e4, 5e5, 1e6]))  # fmt: skip
        return Fixture(seed, index, arch, qtype, "independent", shape=shape, n_merges=r.randint(0, 700),
                       text_lengths=texts)  # fmt: skip
    kw: dict[str, Any] = {"layers": layers, "embd": embd, "ff": ff, "heads": heads, "kv_heads": kv, "head_dim": hd,
                          "vocab": r.randint(290, 3000), "tie_embeddings": r.random() < 0.3}  # fmt: skip
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        kw["interval"] = r.choice([2, 3, 4])
        kw["layers"] = r.randint(kw["interval"], 6)  # llama.cpp aborts on a hybrid without attention layers
        g = r.choice([1, 2, 4])
        kw |= {"ssm_n_group": g, "ssm_dt_rank": g * r.choice([1, 2]), "ssm_d_state": r.choice([16, 32])}
        kw["ssm_d_conv"] = r.choice([2, 3, 4, 5])
        if arch != "qwen3next":
            kw["n_rot"] = r.choice([n for n in (4, 8, 16) if n <= hd])
            kw["rope_sections"] = list(_sections(r, kw["n_rot"] // 2))
        if arch != "qwen35":
            n_exp = r.choice([4, 5, 6, 7, 8, 10])
            kw |= {"n_expert": n_exp, "n_expert_used": r.randint(1, min(4, n_exp))}
            kw |= {"expert_ff": r.choice([16, 32, 64]), "shared_ff": r.choice([32, 64])}
            if kq:
                kw |= {"expert_ff": 256, "shared_ff": 256}
    if arch == "qwen3next" and r.random() < 0.3:
        kw["legacy_ssm_in"] = True
    if arch == "mamba2":
        kw |= {"ssm_head_dim": r.choice([8, 16, 32]), "ssm_d_state": r.choice([8, 16, 32])}
        kw |= {"ssm_n_group": r.choice([1, 2]), "ssm_d_conv": r.choice([2, 3, 4])}
    return Fixture(seed, index, arch, qtype, "builder", builder_kw=kw, text_lengths=texts)
