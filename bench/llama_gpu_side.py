"""llama.cpp's side of `bench/gpu_bench.py`: a GPU build of llama-cpp-python, every layer offloaded,
stock settings otherwise, on the same text, prompt length, generation length and decode batches.
Where the llama_cpp it imports has no GPU backend it says so (`unavailable`) and measures nothing.

Runs in its own process and imports llama_cpp before anything but the standard library: loading a model in a process
that had imported numpy/structlog through the bench's modules first segfaulted (llama-cpp-python
0.3.36 built for CUDA 13 on an H100, 2026-11-24). Prints one JSON object.

    python bench/llama_gpu_side.py MODEL --prompt 512 --gen 128 --repeats 3 --batch 1 2 4 --rounds 3 --block 5
"""

import argparse
import ctypes
import json
import statistics
import time

import llama_cpp  # before numpy and the bench's modules: see above

TEXT = (
    "The history of computing is a story of abstraction layered on abstraction. Early machines were "
    "programmed by rewiring panels; later, stored programs let the same hardware run many tasks. "
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace")
    if not llama_cpp.llama_supports_gpu_offload():
        print(json.dumps({"unavailable": "this llama-cpp-python build has no GPU backend", "system_info": system_info}))
        return
    start = time.perf_counter()
    llm = llama_cpp.Llama(args.model, n_gpu_layers=-1, n_ctx=args.prompt + args.gen + 16, n_batch=512, verbose=False)
    load_s = time.perf_counter() - start
    import numpy as np

    n_vocab = llm.n_vocab()
    tokens = llm.tokenize((TEXT * (1 + args.prompt // 30)).encode(), add_bos=True)[: args.prompt]

    def last_logits() -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)  # waits for the device
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))

    def prompt() -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(tokens)
        last_logits()
        return time.perf_counter() - t

    def generation() -> float:
        llm.reset()
        llm.eval(tokens[:8])
        t = time.perf_counter()
        for _ in range(args.gen):
            llm.eval([int(np.argmax(last_logits()))])
        last_logits()
        return time.perf_counter() - t

    prompt()  # warm-up
    pp = [prompt() for _ in range(args.repeats)]
    tg = [generation() for _ in range(args.repeats)]
    from batched_decode import LlamaSide, measure

    side = LlamaSide(args.model, args.threads, n_gpu_layers=-1, model=llm.model)

    class Idle:  # hyserve's place in `measure`: it runs in the other process
        name = "hyserve"
        tokenize = staticmethod(side.tokenize)

        def start(self, prompts: list, n_ctx: int) -> None:
            pass

        def step(self) -> float:
            return 1.0

        def stop(self) -> None:
            pass

    runs = [measure([side, Idle()], k, args.rounds, args.block, 2) for k in args.batch]
    print(json.dumps({
        "version": llama_cpp.__version__,
        "system_info": system_info,
        "load_s": load_s,
        "prompt_tokens": len(tokens),
        "prompt_tok_s": len(tokens) / statistics.median(pp),
        "gen_tok_s": args.gen / statistics.median(tg),
        "batched_decode_step_s": {str(r["k"]): r["step_ms"]["llama.cpp"] / 1e3 for r in runs},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
