"""Which op makes the GPU path differ from the CPU path: runs a fixture's forward pass on the CPU
backend and replays every backend op on the GPU with the CPU op's own inputs, so each op's
difference is its own (not inherited). Prints, per op and shape, the calls, the differing values
and the largest absolute difference; the first difference of each op is shown as it happens.

    python bench/gpu_op_trace.py llama q4_k_m --kw '{"embd": 256, "ff": 512, "head_dim": 64}'
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from fixtures import make_models
from test_gpu_models import TEXT

from hyserve.logging_setup import configure_logging
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.backend import DeviceRequest, open_backend
from hyserve.model.backend.base import AttentionSpan
from hyserve.model.backend.cpu import CpuBackend
from hyserve.model.backend.gpu import GpuBackend
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES, load_model

# ops that return new tensors / work in place / write a new recurrent state (argument index)
PURE = ["silu", "l2_norm", "rms_norm_groups", "gdn_gates", "softcap", "concat_columns", "columns", "geglu", "swiglu"]
IN_PLACE = ["sigmoid_mul_", "mul_row_", "mul_"]
STATEFUL = {"conv1d": 3, "gated_delta_rule": 6, "mamba2_scan": 8}


class TracingBackend(CpuBackend):
    """The CPU backend, each op also run on `gpu` with the same inputs and compared bit for bit."""

    def __init__(self, gpu: GpuBackend) -> None:
        self.gpu = gpu
        self.stats: dict[str, list[float]] = {}  # op -> [calls, differing values, max |difference|]
        self._caches: dict[int, Any] = {}
        self._moes: dict[int, tuple[Any, Any]] = {}

    def compare(self, op: str, cpu: np.ndarray, gpu_tensor: Any) -> None:
        got = self.gpu.to_host(gpu_tensor).reshape(cpu.shape)
        differ = cpu != got
        n = int(differ.sum())
        s = self.stats.setdefault(op, [0, 0, 0.0])
        if n and s[1] == 0:
            at = tuple(int(i) for i in np.argwhere(differ)[0])
            print(f"first difference in {op}: {n}/{cpu.size} values, e.g. at {at}: {cpu[at]!r} vs {got[at]!r}")
        s[0] += 1
        s[1] += n
        s[2] = max(s[2], float(np.abs(cpu - got).max()) if cpu.size else 0.0)

    def up(self, x: Any) -> Any:
        """A host argument as the GPU backend takes it."""
        if isinstance(x, np.ndarray) and x.dtype == np.float32:
            return self.gpu.vector(np.ascontiguousarray(x).reshape(-1)).reshape(*x.shape)
        if isinstance(x, np.ndarray) and x.dtype == np.int32:
            return self.gpu.ids(x)
        if isinstance(x, list | tuple):
            return type(x)(self.up(y) for y in x)
        return x

    def embed(self, m, tokens):
        r = super().embed(m, tokens)
        self.compare("embed", r, self.gpu.embed(self.gpu.matrix(m), self.gpu.ids(tokens)))
        return r

    def matmul(self, w, x, cancel=None):
        r = super().matmul(w, x)
        self.compare(f"matmul {w.rows}x{w.cols}", r, self.gpu.matmul(self.gpu.matrix(w), self.up(x)))
        return r

    def matmul_many(self, ws, x, cancel=None):
        rs = super().matmul_many(ws, x)
        for w, r, g in zip(ws, rs, self.gpu.matmul_many([self.gpu.matrix(w) for w in ws], self.up(x))):
            self.compare(f"matmul {w.rows}x{w.cols}", r, g)
        return rs

    def rms_norm(self, x, weight, eps, feeds=(), rope=None, gate=None):
        r = super().rms_norm(x, weight, eps)
        self.compare(f"rms_norm {len(weight)}", r, self.gpu.rms_norm(self.up(x), self.up(weight), eps))
        if gate is not None:
            self.mul_silu_(r, gate.reshape(r.shape))
        return r if rope is None else self.rope(r, *rope)

    def rope(self, x, n_head, positions, n_rot, base, scale, neox):
        g = self.gpu.rope(self.up(x), n_head, self.up(positions), n_rot, base, scale, neox)
        r = super().rope(x, n_head, positions, n_rot, base, scale, neox)
        self.compare(f"rope neox={neox}", r, g)
        return r

    def add_(self, dst, a):
        g = self.up(dst)
        self.gpu.add_(g, self.up(a))
        super().add_(dst, a)
        self.compare("add", dst, g)

    def attention(self, spans, q, k, v, positions, window, kq_scale, out):
        super().attention(spans, q, k, v, positions, window, kq_scale, out)
        g_spans = []
        for cache, start, rows in spans:
            gc = self._caches.get(id(cache))
            if gc is None:  # a device cache that follows the CPU one (same K/V rows written)
                gc = self._caches[id(cache)] = self.gpu.kv_cache(*cache.k.shape)
            g_spans.append(AttentionSpan(gc, start, rows))
        g_out = self.up(out)
        self.gpu.attention(g_spans, self.up(q), self.up(k), self.up(v), self.up(positions), window, kq_scale, g_out)
        for _, _, rows in spans:
            picked = self.gpu.take_rows(g_out, np.arange(rows.start, rows.stop, dtype=np.int32))
            self.compare("attention", out[rows], picked)

    def moe_ffn(self, moe, x, cancel=None):
        r = super().moe_ffn(moe, x)
        got = self._moes.get(id(moe))
        if got is None:
            got = self._moes[id(moe)] = (moe, self.gpu.moe(moe))
        self.compare("moe_ffn", r, self.gpu.moe_ffn(got[1], self.up(x)))
        return r


def _traced(name: str, in_place: bool = False, state: int | None = None):
    def op(self: TracingBackend, *args, **kw):
        g_args = [self.up(a) for a in args]
        if state is not None and state < len(args):  # the new state: a fresh device buffer
            g_args[state] = self.gpu.empty(tuple(args[state].shape))
        g = getattr(self.gpu, name)(*g_args, **{k: self.up(v) for k, v in kw.items()})
        r = getattr(CpuBackend, name)(self, *args, **kw)
        if in_place:
            self.compare(name, args[0], g_args[0])
            return r
        if isinstance(r, tuple):
            for i, (a, b) in enumerate(zip(r, g)):
                self.compare(f"{name}[{i}]", a, b)
        else:
            self.compare(name, r, g)
        if state is not None and state < len(args):
            self.compare(f"{name} state", args[state], g_args[state])
        return r

    return op


for _name in PURE:
    setattr(TracingBackend, _name, _traced(_name))
for _name in IN_PLACE:
    setattr(TracingBackend, _name, _traced(_name, in_place=True))
for _name, _at in STATEFUL.items():
    setattr(TracingBackend, _name, _traced(_name, state=_at))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arch")
    p.add_argument("qtype")
    p.add_argument("--kw", type=json.loads, default={}, help="make_models.write_model keywords (JSON)")
    p.add_argument("--tokens", type=int, default=0, help="the first N tokens of the text (0: all)")
    p.add_argument("--adapter", default=None)
    p.add_argument("--numerics", choices=("fast", "exact"), default="exact", help="the GPU numerics mode")
    args = p.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the trace
    trace = TracingBackend(open_backend(DeviceRequest("gpu", gpu_adapter=args.adapter, gpu_numerics=args.numerics)))
    with tempfile.TemporaryDirectory() as tmp:
        path = make_models.write_model(Path(tmp) / "m.gguf", args.arch, qtype=args.qtype, **args.kw)
        arch = ARCHITECTURES[args.arch](GGUFFile.open(path), trace)
        tokens = load_model(path).tokenizer.encode(TEXT)
        if args.tokens:
            tokens = tokens[: args.tokens]
        arch.forward([Segment(arch.new_memory(512), np.asarray(tokens, np.int32), Logits.ALL)])
    print(f"{'op':44s} {'calls':>5s} {'differing':>10s} {'max |diff|':>10s}")
    for op, (calls, n, worst) in trace.stats.items():
        print(f"{op:44s} {int(calls):5d} {int(n):10d} {worst:10.3g}")


if __name__ == "__main__":
    main()
