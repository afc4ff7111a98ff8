//! Attention over a sequence's K/V cache on the device: the new rows stored (f16 pairs, cache
//! index == token position), then one workgroup per (query row, head) (`shaders/attention.wgsl`).

use bytemuck::{bytes_of, Pod, Zeroable};

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::ops::{groups_1d, F64, MATH};

use Access::{Read, ReadWrite, Uniform};

const ATTENTION: &str = include_str!("shaders/attention.wgsl");
static KV_STORE: Kernel = Kernel {
    name: "kv_store",
    sources: &[MATH, F64, ATTENTION],
    entry: "store",
    bindings: &[
        (0, Read),
        (1, Read),
        (2, ReadWrite),
        (3, ReadWrite),
        (6, Uniform),
        (7, Read),
    ],
};
static ATTEND: Kernel = Kernel {
    name: "attend",
    sources: &[MATH, F64, ATTENTION],
    entry: "attend",
    bindings: &[
        (0, Read),
        (2, ReadWrite),
        (3, ReadWrite),
        (4, ReadWrite),
        (5, ReadWrite),
        (6, Uniform),
        (7, Read),
        (8, ReadWrite),
    ],
};

/// Query rows up to which an attention call is a decode step's (or a speculative verification's).
const DECODE_ROWS: usize = 16;

/// One attention call: a sequence's rows row0..row0+n_rows of the batch.
pub struct AttentionSpec {
    pub n_rows: usize,
    pub row0: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub window: usize,
    /// cache position of the first new row (the kernels take the rows' positions, which equal it)
    pub start: usize,
    /// the cache's capacity in positions
    pub n_ctx: usize,
    pub kq_scale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttentionParams {
    v: [u32; 12],
}

fn attention_params(
    a: &AttentionSpec,
    row0: usize,
    n_rows: usize,
    n_ctx: usize,
) -> AttentionParams {
    AttentionParams {
        v: [
            n_rows as u32,
            row0 as u32,
            a.n_head as u32,
            a.n_kv as u32,
            a.head_dim as u32,
            a.window as u32,
            0,
            n_ctx as u32,
            a.kq_scale.to_bits(),
            0,
            0,
            0,
        ],
    }
}

/// Stores the new K/V rows in the cache (f16 pairs) at positions start.., then attends the
/// query rows over the cache, writing rows row0.. of `out` (rows × n_head·head_dim).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    q: &GpuBuffer,
    k: &GpuBuffer,
    v: &GpuBuffer,
    positions: &GpuBuffer,
    kc: &GpuBuffer,
    vc: &GpuBuffer,
    out: &GpuBuffer,
    a: &AttentionSpec,
) {
    // Scores live in a scratch buffer of rows x heads x keys. Decode-sized calls size it for the
    // whole cache, so that nothing they record depends on the step (a captured plan replays them).
    let n_keys = if a.n_rows <= DECODE_ROWS {
        a.n_ctx
    } else {
        a.start + a.n_rows
    };
    let (gx, gy) = groups_1d(a.n_rows * a.n_kv * a.head_dim / 2);
    let p = attention_params(a, a.row0, a.n_rows, n_keys);
    gpu.dispatch(
        &KV_STORE,
        &[],
        &[k.raw(), v.raw(), kc.raw(), vc.raw(), positions.raw()],
        bytes_of(&p),
        [gx, gy, 1],
    );
    // split the rows so the scratch fits a binding
    let per_row = (a.n_head * n_keys * 4) as u64;
    let block = ((gpu.max_binding() / per_row) as usize).clamp(1, a.n_rows.max(1));
    for first in (0..a.n_rows).step_by(block) {
        let rows = block.min(a.n_rows - first);
        let p = attention_params(a, a.row0 + first, rows, n_keys);
        let scratch = gpu.alloc(rows as u64 * per_row);
        let group_sums = gpu.alloc((rows * a.n_head * (n_keys / 8 + 1) * 4) as u64);
        gpu.dispatch(
            &ATTEND,
            &[],
            &[
                q.raw(),
                kc.raw(),
                vc.raw(),
                out.raw(),
                scratch.raw(),
                positions.raw(),
                group_sums.raw(),
            ],
            bytes_of(&p),
            [rows as u32, a.n_head as u32, 1],
        );
    }
}
