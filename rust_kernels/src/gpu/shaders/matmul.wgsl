// y[b, row0 + r] = x[b, :] · W[r, :] for the weight rows of one binding (a large tensor is split over
// several bindings, each dispatched with its first output column `row0`).
// The activations come quantized as the weight format's dot product wants them (quantize_act.wgsl),
// so each 32-value sub-block contributes xd * (scale * Σ q·xq - min * xs) with an exact integer sum,
// as on the CPU. LANES threads share one weight row (LANES = 1: one thread per row, no barriers;
// the best choice for software adapters), each summing sub-blocks lane, lane + LANES, ... in order,
// then a fixed tree joins the lanes. A workgroup covers 64 / LANES weight rows x TILE activation
// rows, so each weight sub-block is read once for the whole tile. Results never depend on the
// other rows of the batch. Needs quant.wgsl (binding 0 = the weight bytes).

override FMT: u32 = 0u;
override LANES: u32 = 16u;
const TILE: u32 = 8u;
const WG: u32 = 64u;

struct Params {
    rows: u32,       // weight rows in this binding
    cols: u32,       // row length (elements)
    row_bytes: u32,  // bytes per weight row
    n_act: u32,      // activation rows
    row0: u32,       // output column of this binding's first row
    out_cols: u32,   // output row length (all rows of the weight)
    groups_x: u32,   // workgroups along x (row blocks wrap onto y past the dispatch limit)
    n_sub: u32,      // sub-blocks of 32 per row
}

@group(0) @binding(1) var<storage, read> xq: array<vec4<f32>>;  // 8 vec4 per sub-block
@group(0) @binding(2) var<storage, read> xd: array<f32>;
@group(0) @binding(3) var<storage, read> xs: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> partial: array<f32, 512>;  // TILE x WG

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let r = (wg.x + wg.y * p.groups_x) * (WG / LANES) + lid / LANES;
    let b0 = wg.z * TILE;
    var acc: array<f32, 8>;
    for (var b = 0u; b < TILE; b++) {
        acc[b] = 0.0;
    }
    if r < p.rows {
        let n_b = min(TILE, p.n_act - b0);
        let row = r * p.row_bytes;
        for (var s = lane; s < p.n_sub; s += LANES) {
            var q: array<vec4<f32>, 8>;
            let sm = load32(FMT, row, s, p.cols, &q);
            var sc = vec2<f32>(1.0, 1.0);
            if FMT == T_Q6_K {
                sc = q6k_scales(row, s);
            }
            for (var b = 0u; b < TILE; b++) {
                if b < n_b {
                    let a = (b0 + b) * p.n_sub + s;
                    var lo = 0.0;
                    var hi = 0.0;
                    for (var k = 0u; k < 4u; k++) {
                        lo += dot(q[k], xq[8u * a + k]);
                        hi += dot(q[k + 4u], xq[8u * a + 4u + k]);
                    }
                    acc[b] += xd[a] * (sm.x * (sc.x * lo + sc.y * hi)) - sm.y * xs[a];
                }
            }
        }
    }
    if LANES > 1u {
        for (var b = 0u; b < TILE; b++) {
            partial[b * WG + lid] = acc[b];
        }
        workgroupBarrier();
        for (var stride = LANES / 2u; stride > 0u; stride >>= 1u) {
            if lane < stride {
                for (var b = 0u; b < TILE; b++) {
                    partial[b * WG + lid] += partial[b * WG + lid + stride];
                }
            }
            workgroupBarrier();
        }
        for (var b = 0u; b < TILE; b++) {
            acc[b] = partial[b * WG + lid];
        }
    }
    if lane == 0u && r < p.rows {
        for (var b = 0u; b < min(TILE, p.n_act - b0); b++) {
            y[(b0 + b) * p.out_cols + p.row0 + r] = acc[b];
        }
    }
}
