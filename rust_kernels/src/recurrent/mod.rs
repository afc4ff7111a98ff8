//! Recurrent-layer kernels with llama.cpp's CPU numerics (model reference §3.4, §5.3–5.4, §6):
//! - `conv1d_causal`: depthwise causal short convolution with carried state (`ggml_ssm_conv`), as
//!   Qwen3.5 Gated DeltaNet and Mamba2 use it; optional bias (Mamba2) and SiLU;
//! - `l2_norm`: `x / max(sqrt(Σx²), eps)` per row (`ggml_l2_norm`), and `gdn_l2_norm`, the form
//!   current llama.cpp's qwen35 graph uses for q and k (`build_gdn_l2_norm`: RMSNorm with
//!   `eps / n`, then times `1/sqrt(n)`, i.e. `x / sqrt(Σx² + eps)`);
//! - `gated_delta_rule`: the Gated DeltaNet recurrence as the fused CPU `GATED_DELTA_NET` op runs it;
//! - `mamba2_scan`: the Mamba2 selective scan (`ggml_ssm_scan`, scalar decay per head) plus D skip.
//!
//! Batch invariance: tokens are processed strictly in order, one at a time, each with a fixed
//! reduction order, and the state lives in f32 exactly as it is stored between calls. A token's
//! output and the final state are therefore the same bits whether a sequence comes in one call, in
//! uneven chunks or token by token, and whatever the thread count: work is only split across heads
//! (or, for the convolution, across output tokens, which are independent).
//!
//! Both paths give the same bits, and the bits of llama.cpp's x86 AVX2+FMA build (GCC, which
//! contracts `a*b + c` into FMAs, also across vector intrinsics, and vectorises in-order scalar
//! sums), checked op by op against the ggml that llama-cpp-python 0.3.36 ships
//! (tests/test_recurrent_kernels.py). Sums over a head dimension follow ggml's AVX2
//! `ggml_vec_dot_f32`: 4×8 FMA lanes over the
//! first `n & !31` elements, lane `i % 32`, reduced by `GGML_F32x8_REDUCE` (v0+v2, v1+v3, their
//! sum, the 128-bit halves, two `hadd`s), then the rest in order as `ordered_sum` describes. The
//! scalar path emulates those lanes; elementwise steps are the same single operations (mul, add,
//! fused multiply-add) on both paths.

mod conv;
mod delta;
mod mamba2;
mod norm;
mod sums;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

pub use conv::{conv1d_causal, conv1d_causal_from, conv_is_serial, CONV_SERIAL_TOKENS};
pub use delta::{gated_delta_rule, GdnShape};
pub use mamba2::{mamba2_scan, softplus, Mamba2Shape};
pub use norm::{gdn_l2_norm, l2_norm};
