"""Tests for hyserve.model.tokenizer, with llama.cpp (llama-cpp-python) as the oracle.

Vocabularies: the real Gemma 3 270M GGUF (SentencePiece, 262k tokens) and small byte-level BPE
GGUFs written by tests/fixtures/bpe_vocab.py with the pre-tokenizers qwen2, qwen35, llama3 (plus
gpt-2 and default). Every comparison runs each string with add_special and parse_special both on
and off. Tests that need the oracle skip when llama_cpp cannot be imported.
"""

import pytest

# the shared checks are plain modules: their asserts explain a failure only when pytest rewrites them
pytest.register_assert_rewrite("tokenizer.checks", "tokenizer.strings")
