//! The GPU path: the model's operations as WGSL compute shaders (`shaders/`, one file per op
//! family) run through wgpu on Vulkan, Metal or DX12.
//!
//! - `adapter`: which adapter to open (backends, ranking, the error naming what was found).
//! - `numerics`: the two numerics modes (fast: the adapter's float operations; exact: the CPU's bits).
//! - `features`: optional adapter features (subgroups, shader-f16) and the shader preprocessor
//!   that picks a variant.
//! - `device`: the device, pipelines built once, pooled buffers, the one pending
//!   command encoder that a forward call records into, uploads and read-backs.
//! - `open`: opening a device, and the probes of its `fma` and of the optional features.
//! - `weights`: GGUF tensors uploaded once in their block formats, split across bindings.
//! - `ops`: one function per operation; each records a dispatch and returns at once.
//! - `attention`: K/V cache writes and attention over the cache.
//! - `transfer`: uploads, writes and read-backs between host and device.
//! - `matvec`: dense matmuls, on `matmul.wgsl` (exact numerics) or `matmul_fast.wgsl` (fast).
//! - `recorder`: the pending encoder, the compute pass its dispatches share, their parameters.
//! - `capture`: a forward captured once as a plan of commands, replayed in one call per step.
//! - `profile`: timestamp queries per dispatch (where the adapter has them), for the bench.
//! - `moe`: the mixture-of-experts FFN (routing, expert FFNs on the block-format expert tensors).
//!
//! Work is recorded, not run: a forward call's dispatches go into one command encoder that is
//! submitted when a result is read back (`Gpu::read`), or dropped unrun (`Gpu::discard`).
//! Every kernel reduces in a fixed order with no float atomics, so results are deterministic and a
//! row's result does not depend on the other rows of its batch.

pub mod adapter;
pub mod attention;
pub mod capture;
pub mod device;
pub mod features;
pub mod matvec;
pub mod moe;
pub mod norm;
pub mod numerics;
pub mod open;
pub mod ops;
pub mod profile;
pub mod quantize;
pub mod recorder;
pub mod recurrent;
pub mod transfer;
pub mod weights;

pub use adapter::AdapterChoice;
pub use device::{Gpu, GpuBuffer};
pub use numerics::Numerics;
pub use weights::GpuWeight;
