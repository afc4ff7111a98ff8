"""Tokenizer built from the vocabulary in a GGUF file's metadata, matching llama.cpp's token ids.

- `vocabulary`: what llama.cpp's loader makes of ``tokenizer.ggml.*`` (attributes, specials, EOG);
- `pretokenizers`: the regex lists of byte-level BPE vocabularies (``tokenizer.ggml.pre``);
- `hf_build`: the Hugging Face `tokenizers` model that reproduces llama.cpp's byte-level BPE, cached
  (SentencePiece vocabularies encode in the kernel wheel: `hyserve_kernels.SpmVocab`);
- `tokenizer`: `Tokenizer` (special-token partition, encode, decode) and `IncrementalDecoder`.
"""

from hyserve.model.tokenizer.errors import TokenizerError
from hyserve.model.tokenizer.tokenizer import IncrementalDecoder, Tokenizer

__all__ = ["IncrementalDecoder", "Tokenizer", "TokenizerError"]
