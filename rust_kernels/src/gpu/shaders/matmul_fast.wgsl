// Fast numerics, dense weights: y[b, row0 + r] = x[b, :] · W[r, :] for the weight rows of one
// binding (a large tensor is split over several bindings, each dispatched with its first output
// column `row0`), or for up to four weights of one format and row length at once, each into its
// own output (Q/K/V, gate/up: one dispatch instead of several, the same bits). A workgroup's rows
// all belong to one part: part k takes the workgroups from first_group[k] on. The weights and
// outputs are reached through `wword` and `put`: matmul_fast_one.wgsl (one weight, binding 0 and
// output 5) or matmul_fast_parts.wgsl (four of each), which also declare `part`.
//
// The matrix-vector shape of the fast GPU engines: a weight row is read by V = 16 lanes, lane j
// taking the row's sub-blocks of 32 weights j, j + 16, j + 32, ... (16 neighbouring lanes read 16
// neighbouring sub-blocks, so a row's block bytes are read in consecutive runs), and a workgroup is
// 64 / THREADS weight rows x T = 8 activation rows (a prompt chunk or a batch is ceil(n / T)
// workgroups along z). On GPUs (THREADS = 16) a thread is a lane and the workgroup copies each
// step's activations (T rows x 16 sub-blocks) into workgroup memory, read there by all its rows;
// on software adapters (THREADS = 1), where barriers cost more than they share, one thread runs a
// row's 16 lanes in turn and reads the activations in place.
//
// One output's order of operations is fixed by the row alone, whatever n, the tile or THREADS:
// lane j adds its sub-blocks in ascending order, one explicit fused multiply-add per term, and the
// 16 lane sums are joined by one fixed tree (tree16). So a row's bits never depend on the batch or
// on how a prompt is chunked, and are the same run after run (no atomics, no subgroup operations).
//
// Activations come as quantize_act.wgsl writes them for the format (the same kinds as the CPU, so
// the same integer products): per sub-block the products of the integer quants are summed in f32,
// which is exact (|sum| < 2^24 for every format), then scaled. Float formats take f32, f16- or
// bf16-rounded activations and add the 32 products in order. Needs quant.wgsl (binding 0).

override FMT: u32 = 0u;
override THREADS: u32 = 16u;  // threads per weight row: 16 (GPUs) or 1 (software adapters)
const V: u32 = 16u;  // lanes per weight row
const T: u32 = 8u;   // activation rows per workgroup

struct Params {
    cols: u32,       // row length (elements)
    row_bytes: u32,  // bytes per weight row
    n_act: u32,      // activation rows
    row0: u32,       // output column of the binding's first row (0 for parts)
    groups_x: u32,   // workgroups along x (row groups wrap onto y past the dispatch limit)
    n_sub: u32,      // sub-blocks of 32 per row
    first_group: vec4<u32>,  // per part: its first workgroup (past the last workgroup when unused)
    rows: vec4<u32>,         // per part: weight rows in its binding
    out_cols: vec4<u32>,     // per part: output row length (all rows of its weight)
}

@group(0) @binding(1) var<storage, read> xq: array<vec4<f32>>;  // 8 vec4 per sub-block
@group(0) @binding(2) var<storage, read> xd: array<f32>;
@group(0) @binding(3) var<storage, read> xs: array<f32>;
@group(0) @binding(4) var<storage, read> xh: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

// One step's activations, T rows x V sub-blocks x 8 vec4 (16 KiB, WebGPU's guaranteed size); after
// the last step, the lane sums: (row in the workgroup, lane) x T as two vec4.
var<workgroup> stage: array<vec4<f32>, 1024>;

// Quarter k of activation sub-block g (global index), staged at t (b * V + lane) on GPUs.
fn act(t: u32, g: u32, k: u32) -> vec4<f32> {
    if THREADS > 1u {
        return stage[8u * t + k];
    }
    return xq[8u * g + k];
}

fn is_float(fmt: u32) -> bool {
    return fmt == T_F32 || fmt == T_F16 || fmt == T_BF16;
}

// acc plus the products of one weight sub-block (load32's q, scales sm, Q6_K's 16-scales sc) with
// activation sub-block g (staged at t).
fn term(acc: f32, q: ptr<function, array<vec4<f32>, 8>>, sm: vec2<f32>, sc: vec2<f32>, t: u32, g: u32) -> f32 {
    if is_float(FMT) {
        var a = acc;
        for (var k = 0u; k < 8u; k++) {
            let wv = (*q)[k];
            let xv = act(t, g, k);
            a = fma(wv.x, xv.x, a);
            a = fma(wv.y, xv.y, a);
            a = fma(wv.z, xv.z, a);
            a = fma(wv.w, xv.w, a);
        }
        return a;
    }
    // integer quants: these sums are exact in any order
    var lo = 0.0;
    var hi = 0.0;
    for (var k = 0u; k < 4u; k++) {
        lo += dot((*q)[k], act(t, g, k));
        hi += dot((*q)[k + 4u], act(t, g, k + 4u));
    }
    let d = xd[g];
    if FMT == T_Q6_K {
        return fma(sm.x * d, sc.x * lo + sc.y * hi, acc);
    }
    var a = fma(sm.x * d, lo + hi, acc);
    if FMT == T_Q4_1 || FMT == T_Q5_1 {
        a = fma(-sm.y, xs[g], a);  // + m * (d * sum(q)) of the Q8_1 activations
    } else if FMT == T_Q4_K || FMT == T_Q5_K {
        a = fma(-sm.y * d, xs[g] + xh[g], a);  // - dmin * m * d * sum(q)
    }
    return a;
}

// Sub-block s of the weight row at byte `row` against the tile's n_b activation rows from b0.
fn add_sub(acc: ptr<function, array<f32, 8>>, row: u32, s: u32, lane: u32, b0: u32, n_b: u32) {
    var q: array<vec4<f32>, 8>;
    let sm = load32(FMT, row, s, p.cols, &q);
    var sc = vec2<f32>(1.0);
    if FMT == T_Q6_K {
        sc = q6k_scales(row, s);
    }
    for (var b = 0u; b < T; b++) {
        if b < n_b {
            (*acc)[b] = term((*acc)[b], &q, sm, sc, b * V + lane, (b0 + b) * p.n_sub + s);
        }
    }
}

// The 16 lane sums of one output, joined in one fixed order.
fn tree16(v: ptr<function, array<f32, 16>>) -> f32 {
    for (var h = 8u; h > 0u; h = h >> 1u) {
        for (var i = 0u; i < h; i++) {
            (*v)[i] = (*v)[i] + (*v)[i + h];
        }
    }
    return (*v)[0];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let per_wg = 64u / THREADS;  // weight rows per workgroup
    let g = wg.x + wg.y * p.groups_x;
    part = u32(g >= p.first_group.y) + u32(g >= p.first_group.z) + u32(g >= p.first_group.w);
    let rows = p.rows[part];
    let out_cols = p.out_cols[part];
    let r0 = (g - p.first_group[part]) * per_wg;
    let r = r0 + lid / THREADS;
    let live = r < rows;
    let row = r * p.row_bytes;
    let b0 = wg.z * T;
    let n_b = min(T, p.n_act - b0);
    if THREADS == 1u {
        if live {
            var sums: array<f32, 128>;  // lane j's sum for activation row b at j * T + b
            for (var j = 0u; j < V; j++) {
                var acc: array<f32, 8>;
                for (var b = 0u; b < T; b++) {
                    acc[b] = 0.0;
                }
                for (var s = j; s < p.n_sub; s += V) {
                    add_sub(&acc, row, s, j, b0, n_b);
                }
                for (var b = 0u; b < T; b++) {
                    sums[j * T + b] = acc[b];
                }
            }
            for (var b = 0u; b < n_b; b++) {
                var v: array<f32, 16>;
                for (var j = 0u; j < V; j++) {
                    v[j] = sums[j * T + b];
                }
                put((b0 + b) * out_cols + p.row0 + r, tree16(&v));
            }
        }
        return;
    }
    let lane = lid % THREADS;
    var acc: array<f32, 8>;
    for (var b = 0u; b < T; b++) {
        acc[b] = 0.0;
    }
    for (var s0 = 0u; s0 < p.n_sub; s0 += V) {
        workgroupBarrier();  // the previous step's reads are done
        for (var i = lid; i < n_b * V * 8u; i += 64u) {
            let c = (i / 8u) % V;
            if s0 + c < p.n_sub {
                stage[i] = xq[8u * ((b0 + i / (V * 8u)) * p.n_sub + s0 + c) + i % 8u];
            }
        }
        workgroupBarrier();
        let s = s0 + lane;
        if live && s < p.n_sub {
            add_sub(&acc, row, s, lane, b0, n_b);
        }
    }
    workgroupBarrier();  // the last step's reads are done: the stage now holds the lane sums
    stage[2u * lid] = vec4<f32>(acc[0], acc[1], acc[2], acc[3]);
    stage[2u * lid + 1u] = vec4<f32>(acc[4], acc[5], acc[6], acc[7]);
    workgroupBarrier();
    if lid < per_wg * T {
        let rr = lid / T;
        let b = lid % T;
        if r0 + rr < rows && b < n_b {
            var v: array<f32, 16>;
            for (var j = 0u; j < V; j++) {
                v[j] = stage[2u * (rr * V + j) + b / 4u][b % 4u];
            }
            put((b0 + b) * out_cols + p.row0 + r0 + rr, tree16(&v));
        }
    }
}
