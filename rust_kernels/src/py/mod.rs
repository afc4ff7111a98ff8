//! The Python bindings, one file per kernel domain: `matmul` (weights, matmul, row lookup), `ops`
//! (norms, RoPE, activations, attention), `recurrent`, `moe`, `unary`, `spm` (vocabulary and
//! tokenizer), `gguf` (metadata strings), `runtime` (threads, SIMD path) and `gpu/` (the device,
//! its tensors and ops). `common` holds what they share: the cancel flag and the argument checks.
//!
//! Every entry point checks shapes, then releases the GIL for the computation. Weights stay in the
//! GGUF memory map: `QMatrix` keeps a reference to the numpy view and reads its bytes in place.

pub(crate) mod common;
pub(crate) mod gguf;
pub(crate) mod gpu;
pub(crate) mod matmul;
pub(crate) mod moe;
pub(crate) mod ops;
pub(crate) mod recurrent;
pub(crate) mod runtime;
pub(crate) mod spm;
pub(crate) mod unary;
