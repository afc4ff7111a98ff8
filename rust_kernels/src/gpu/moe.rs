//! The mixture-of-experts FFN on the device (moe.wgsl around matmul.wgsl's MOE mode), the GPU
//! counterpart of `crate::moe::moe_forward`: the expert tensors stay in their GGUF block formats,
//! uploaded once; routing, grouping by expert, the expert FFNs and the weighted sum are recorded
//! into the pending encoder like every other op (no read-back).

use bytemuck::bytes_of;

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::ops::{
    self, groups_1d, groups_wrapped, Elementwise, QuantizedAct, F64, MATMUL, MAX_GROUPS,
};
use super::weights::GpuWeight;
use crate::matmul::Weight;
use crate::moe::{Moe, Routing};
use crate::quant::GgmlType;

use Access::{Read, ReadWrite, Uniform};

const MOE: &str = include_str!("shaders/moe.wgsl");
const MATH: &str = include_str!("shaders/math.wgsl");

/// The most experts a router may have (the routing shader's per-row arrays).
pub const MAX_EXPERTS: usize = 512;
const TILE: usize = 8;

static ROUTE: Kernel = Kernel {
    name: "moe_route",
    sources: &[MATH, F64, MOE],
    entry: "route",
    bindings: &[(0, Read), (1, ReadWrite), (2, ReadWrite), (3, Uniform)],
};
static PLAN: Kernel = Kernel {
    name: "moe_plan",
    sources: &[MATH, F64, MOE],
    entry: "plan_pairs",
    bindings: &[(1, ReadWrite), (3, Uniform), (4, ReadWrite)],
};
static COMBINE: Kernel = Kernel {
    name: "moe_combine",
    sources: &[MATH, F64, MOE],
    entry: "combine",
    bindings: &[
        (2, ReadWrite),
        (3, Uniform),
        (5, Read),
        (6, ReadWrite),
        (7, Read),
        (8, Read),
    ],
};

/// The ggml type id of a weight format (quant.wgsl's T_*).
fn type_id(t: GgmlType) -> u32 {
    match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q5_0 => 6,
        GgmlType::Q5_1 => 7,
        GgmlType::Q8_0 => 8,
        GgmlType::Q4K => 12,
        GgmlType::Q5K => 13,
        GgmlType::Q6K => 14,
        GgmlType::BF16 => 30,
    }
}

fn upload(gpu: &Gpu, w: &Weight) -> Result<GpuWeight, String> {
    GpuWeight::upload(gpu, type_id(w.t), w.data, w.rows, w.cols)
}

/// Rows `offset .. offset + rows` of every expert's block of a 3-D expert tensor.
#[derive(Clone, Copy)]
struct View {
    /// which of `GpuMoe::tensors`
    tensor: usize,
    offset: usize,
    rows: usize,
}

struct SharedExpert {
    gate: GpuWeight,
    up: GpuWeight,
    down: GpuWeight,
    gate_inp: Option<GpuWeight>,
}

/// One layer's MoE FFN on the device.
pub struct GpuMoe {
    router: GpuWeight,
    /// the expert tensors: gate and up (one tensor when fused), down
    tensors: Vec<GpuWeight>,
    gate: View,
    up: View,
    down: View,
    routing: Routing,
    shared: Option<SharedExpert>,
    pub n_expert: usize,
    pub n_embd: usize,
    pub n_ff: usize,
}

/// The routing of a batch on the device: `ids` (u32) and `weights` (f32), rows × n_used.
pub struct GpuRoutes {
    pub ids: GpuBuffer,
    pub weights: GpuBuffer,
}

/// Activations quantized once per act kind (as `matmul_many` shares them between weights).
struct Acts<'a> {
    x: &'a GpuBuffer,
    n: usize,
    cols: usize,
    done: Vec<QuantizedAct>,
}

impl Acts<'_> {
    fn of(&mut self, gpu: &Gpu, ggml_type: u32) -> &QuantizedAct {
        let kind = ops::act_kind(ggml_type);
        let at = match self.done.iter().position(|q| q.kind == kind) {
            Some(i) => i,
            None => {
                self.done
                    .push(ops::quantize_act(gpu, self.x, self.n, self.cols, kind));
                self.done.len() - 1
            }
        };
        &self.done[at]
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MoeParams {
    n: u32,
    n_expert: u32,
    k: u32,
    norm: u32,
    scale: f32,
    n_embd: u32,
    shared: u32,
    groups_x: u32,
    pairs: u32,
    max_tiles: u32,
    pad: [u32; 2],
}

impl GpuMoe {
    pub fn upload(gpu: &Gpu, moe: &Moe) -> Result<Self, String> {
        let n_expert = moe.n_expert();
        if n_expert > MAX_EXPERTS {
            return Err(format!(
                "{n_expert} experts: the GPU routing takes at most {MAX_EXPERTS}"
            ));
        }
        let mut tensors = vec![upload(gpu, &moe.gate.all)?];
        let fused = std::ptr::eq(moe.gate.all.data.as_ptr(), moe.up.all.data.as_ptr());
        let up_tensor = if fused {
            0
        } else {
            tensors.push(upload(gpu, &moe.up.all)?);
            1
        };
        tensors.push(upload(gpu, &moe.down.all)?);
        let view = |tensor: usize, e: &crate::moe::Experts| View {
            tensor,
            offset: e.offset,
            rows: e.rows,
        };
        let shared = match &moe.shared {
            Some(s) => Some(SharedExpert {
                gate: upload(gpu, &s.gate)?,
                up: upload(gpu, &s.up)?,
                down: upload(gpu, &s.down)?,
                gate_inp: s.gate_inp.as_ref().map(|w| upload(gpu, w)).transpose()?,
            }),
            None => None,
        };
        Ok(GpuMoe {
            router: upload(gpu, &moe.router)?,
            gate: view(0, &moe.gate),
            up: view(up_tensor, &moe.up),
            down: view(tensors.len() - 1, &moe.down),
            tensors,
            routing: moe.routing,
            shared,
            n_expert,
            n_embd: moe.n_embd(),
            n_ff: moe.gate.rows,
        })
    }

    /// Device bytes of the weights.
    pub fn bytes(&self) -> usize {
        let shared = self.shared.as_ref().map_or(0, |s| {
            s.gate.bytes()
                + s.up.bytes()
                + s.down.bytes()
                + s.gate_inp.as_ref().map_or(0, GpuWeight::bytes)
        });
        self.router.bytes() + self.tensors.iter().map(GpuWeight::bytes).sum::<usize>() + shared
    }

    fn params(&self, n: usize) -> MoeParams {
        let pairs = n * self.routing.n_used;
        MoeParams {
            n: n as u32,
            n_expert: self.n_expert as u32,
            k: self.routing.n_used as u32,
            norm: u32::from(self.routing.norm),
            scale: self.routing.scale,
            n_embd: self.n_embd as u32,
            shared: 0,
            groups_x: 0,
            pairs: pairs as u32,
            max_tiles: max_tiles(pairs, self.n_expert) as u32,
            pad: [0; 2],
        }
    }

    /// Routes `n` rows of router logits (n × n_expert, on the device).
    pub fn route_logits(&self, gpu: &Gpu, logits: &GpuBuffer, n: usize) -> GpuRoutes {
        let k = self.routing.n_used;
        let routes = GpuRoutes {
            ids: gpu.alloc((n * k * 4) as u64),
            weights: gpu.alloc((n * k * 4) as u64),
        };
        let (gx, gy) = groups_1d(n);
        let p = MoeParams {
            groups_x: gx,
            ..self.params(n)
        };
        gpu.dispatch(
            &ROUTE,
            &[],
            &[logits.raw(), routes.ids.raw(), routes.weights.raw()],
            bytes_of(&p),
            [gx, gy, 1],
        );
        routes
    }

    fn router_logits(&self, gpu: &Gpu, acts: &mut Acts) -> GpuBuffer {
        ops::matmul(gpu, &self.router, acts.of(gpu, self.router.ggml_type))
    }

    /// The routing of `x` (n × n_embd).
    pub fn route(&self, gpu: &Gpu, x: &GpuBuffer, n: usize) -> GpuRoutes {
        let mut acts = Acts {
            x,
            n,
            cols: self.n_embd,
            done: Vec::new(),
        };
        let logits = self.router_logits(gpu, &mut acts);
        self.route_logits(gpu, &logits, n)
    }

    /// The FFN output for `x` (n × n_embd): n × n_embd.
    pub fn forward(&self, gpu: &Gpu, x: &GpuBuffer, n: usize) -> GpuBuffer {
        let (k, n_embd, n_ff) = (self.routing.n_used, self.n_embd, self.n_ff);
        let pairs = n * k;
        let mut acts = Acts {
            x,
            n,
            cols: n_embd,
            done: Vec::new(),
        };
        let logits = self.router_logits(gpu, &mut acts);
        let routes = self.route_logits(gpu, &logits, n);

        // the pairs grouped by expert, in tiles
        let params = self.params(n);
        let plan = gpu.alloc(((pairs + 4 * params.max_tiles as usize) * 4) as u64);
        gpu.dispatch(
            &PLAN,
            &[],
            &[routes.ids.raw(), plan.raw()],
            bytes_of(&params),
            [1, 1, 1],
        );

        // each pair's expert FFN: gate and up on its token's row, SwiGLU, down
        let gate = self.experts(
            gpu,
            self.gate,
            acts.of(gpu, self.tensors[self.gate.tensor].ggml_type),
            &plan,
            &params,
            k,
        );
        let up = self.experts(
            gpu,
            self.up,
            acts.of(gpu, self.tensors[self.up.tensor].ggml_type),
            &plan,
            &params,
            k,
        );
        let h = gpu.alloc((pairs * n_ff * 4) as u64);
        ops::elementwise(
            gpu,
            Elementwise::Swiglu,
            &h,
            Some(&gate),
            Some(&up),
            pairs * n_ff,
            0,
            0.0,
        );
        let down_type = self.tensors[self.down.tensor].ggml_type;
        let hq = ops::quantize_act(gpu, &h, pairs, n_ff, ops::act_kind(down_type));
        let y = self.experts(gpu, self.down, &hq, &plan, &params, 1);

        // the shared expert, on every row
        let mut mode = 0;
        let (mut ysh, mut gsh) = (None, None);
        if let Some(s) = &self.shared {
            let sg = ops::matmul(gpu, &s.gate, acts.of(gpu, s.gate.ggml_type));
            let su = ops::matmul(gpu, &s.up, acts.of(gpu, s.up.ggml_type));
            if let Some(gi) = &s.gate_inp {
                gsh = Some(ops::matmul(gpu, gi, acts.of(gpu, gi.ggml_type)));
            }
            let n_sh = s.gate.rows;
            let hs = gpu.alloc((n * n_sh * 4) as u64);
            ops::elementwise(
                gpu,
                Elementwise::Swiglu,
                &hs,
                Some(&sg),
                Some(&su),
                n * n_sh,
                0,
                0.0,
            );
            let hsq = ops::quantize_act(gpu, &hs, n, n_sh, ops::act_kind(s.down.ggml_type));
            ysh = Some(ops::matmul(gpu, &s.down, &hsq));
            mode = if gsh.is_some() { 2 } else { 1 };
        }

        let out = gpu.alloc((n * n_embd * 4) as u64);
        let (gx, gy) = groups_1d(n * n_embd);
        let p = MoeParams {
            shared: mode,
            groups_x: gx,
            ..params
        };
        let ysh = ysh.as_ref().map_or(&gpu.dummy, GpuBuffer::raw);
        let gsh = gsh.as_ref().map_or(&gpu.dummy, GpuBuffer::raw);
        gpu.dispatch(
            &COMBINE,
            &[],
            &[routes.weights.raw(), y.raw(), out.raw(), ysh, gsh],
            bytes_of(&p),
            [gx, gy, 1],
        );
        out
    }

    /// The products of every pair's expert rows of `view` with activation row pair / act_div:
    /// pairs × view.rows.
    fn experts(
        &self,
        gpu: &Gpu,
        view: View,
        x: &QuantizedAct,
        plan: &GpuBuffer,
        params: &MoeParams,
        act_div: usize,
    ) -> GpuBuffer {
        let w = &self.tensors[view.tensor];
        let pairs = params.pairs as usize;
        let out = gpu.alloc((pairs * view.rows * 4) as u64);
        let lanes = gpu.lanes();
        let (gx, gy) = groups_wrapped(view.rows.div_ceil(64 / lanes as usize));
        let stride = w.rows / self.n_expert;
        for (buf, row0, rows) in &w.chunks {
            if stride > 0 && !chunk_has_view_rows(*row0, *rows, stride, view) {
                continue;
            }
            let tiles = params.max_tiles;
            for tile0 in (0..tiles).step_by(MAX_GROUPS as usize) {
                let p: [u32; 16] = [
                    view.rows as u32,
                    w.cols as u32,
                    w.row_bytes as u32,
                    x.n as u32,
                    *row0 as u32,
                    view.rows as u32,
                    gx,
                    w.cols.div_ceil(32) as u32,
                    *rows as u32,
                    stride as u32,
                    view.offset as u32,
                    act_div as u32,
                    tile0,
                    pairs as u32,
                    0,
                    0,
                ];
                gpu.dispatch(
                    &MATMUL,
                    &[("FMT", w.ggml_type), ("LANES", lanes), ("MOE", 1)],
                    &[
                        buf.raw(),
                        x.xq.raw(),
                        x.xd.raw(),
                        x.xs.raw(),
                        x.xh.raw(),
                        out.raw(),
                        plan.raw(),
                    ],
                    bytes_of(&p),
                    [gx, gy, (tiles - tile0).min(MAX_GROUPS)],
                );
            }
        }
        out
    }
}

/// An upper bound on the tiles of `pairs` pairs over `n_expert` experts: sum of ceil(count / 8).
fn max_tiles(pairs: usize, n_expert: usize) -> usize {
    pairs.div_ceil(TILE) + n_expert.min(pairs)
}

/// Whether rows row0..row0+rows of the whole tensor hold any row of the view of some expert.
fn chunk_has_view_rows(row0: usize, rows: usize, stride: usize, view: View) -> bool {
    let (first, last) = (row0, row0 + rows); // [first, last)
                                             // rows of expert e's view: e*stride + offset .. + view.rows
    let e0 = first / stride;
    let e1 = (last - 1) / stride;
    (e0..=e1).any(|e| {
        let (a, b) = (
            e * stride + view.offset,
            e * stride + view.offset + view.rows,
        );
        a < last && b > first
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_bound_covers_every_grouping() {
        // the worst case: as many experts as possible with one pair over a multiple of 8
        for pairs in 1..64 {
            for n_expert in 1..20 {
                let worst: usize = (0..n_expert.min(pairs))
                    .map(|e| {
                        let c = pairs / n_expert.min(pairs)
                            + usize::from(e < pairs % n_expert.min(pairs));
                        c.div_ceil(TILE)
                    })
                    .sum();
                assert!(
                    worst <= max_tiles(pairs, n_expert),
                    "pairs {pairs} experts {n_expert}"
                );
            }
        }
    }

    #[test]
    fn chunks_without_view_rows_are_skipped() {
        let gate = View {
            tensor: 0,
            offset: 0,
            rows: 4,
        };
        let up = View { offset: 4, ..gate };
        // experts of 8 rows (gate 0..4, up 4..8): a chunk of rows 4..8 has only up rows
        assert!(!chunk_has_view_rows(4, 4, 8, gate));
        assert!(chunk_has_view_rows(4, 4, 8, up));
        assert!(chunk_has_view_rows(3, 2, 8, gate));
        assert!(chunk_has_view_rows(12, 8, 8, gate));
    }
}
