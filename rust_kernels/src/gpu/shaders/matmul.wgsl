// y[b, row0 + r] = x[b, :] · W[r, :] for the weight rows of one binding (a large tensor is split over
// several bindings, each dispatched with its first output column `row0`).
//
// The CPU kernels' operation order (rust_kernels/src/quant, itself llama.cpp's AVX2 order), so that
// quantized formats give the CPU's bits: the activations come quantized as the format's dot product
// takes them (quantize_act.wgsl); the CPU's eight float lanes of a weight row are LANES threads
// (8 on GPUs: thread k is lane k; 1 on software adapters, where barriers cost more than they share:
// one thread runs the eight lanes; the results are the same bits). Per block (32 weights; 256 for K-quants) lane k holds the exact integer sum of the
// products of elements 4k..4k+3 of each 32 (times their sub-block scales), and adds it times the
// block's scale into its float accumulator with one fused multiply-add, block after block. The
// eight lanes are joined by ggml's hsum8, plus the min terms of Q4_1/Q5_1/Q4_K/Q5_K in the CPU's
// order. Float formats (F32/F16/BF16) use the same lanes, while the CPU sums those in f64: close,
// not identical. A workgroup is a tile of 64 / LANES weight rows x TILE activation rows (a prompt
// chunk is ceil(n / TILE) tiles): each weight block is read once for the tile, and the tile's
// activations are copied into workgroup memory a step of 8 sub-blocks at a time (LANES = 8), read
// once for all the workgroup's rows. Tiling changes only where the values are read from, never the order in which
// an output's products are added: a result never depends on the other rows of the batch.
// MOE = 1 (the experts of a mixture-of-experts FFN, moe.wgsl): a tile is up to TILE (token, slot)
// pairs routed to one expert, listed by moe.wgsl's plan; the weight rows are that expert's, the
// products the same per-row dot products as MOE = 0 on that expert's rows.
// Needs quant.wgsl (binding 0 = the weight bytes).

override FMT: u32 = 0u;
override LANES: u32 = 8u;  // 8 or 1
override MOE: u32 = 0u;
const TILE: u32 = 8u;

struct Params {
    rows: u32,       // weight rows in this binding
    cols: u32,       // row length (elements)
    row_bytes: u32,  // bytes per weight row
    n_act: u32,      // activation rows
    row0: u32,       // output column of this binding's first row
    out_cols: u32,   // output row length (all rows of the weight)
    groups_x: u32,   // workgroups along x (row blocks wrap onto y past the dispatch limit)
    n_sub: u32,      // sub-blocks of 32 per row
    // MOE = 1: rows in this binding, rows from one expert to the next, the view's first row
    // within an expert (a fused gate_up tensor), activation row = pair / act_div, first tile of
    // this dispatch, where the tiles start in `plan`
    chunk_rows: u32,
    stride: u32,
    offset: u32,
    act_div: u32,
    tile0: u32,
    tiles_at: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(1) var<storage, read> xq: array<vec4<f32>>;  // 8 vec4 per sub-block
@group(0) @binding(2) var<storage, read> xd: array<f32>;
@group(0) @binding(3) var<storage, read> xs: array<f32>;
@group(0) @binding(4) var<storage, read> xh: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;
// MOE = 1: the (token, slot) pairs grouped by expert, then tiles of (expert, first pair, pairs, 0)
@group(0) @binding(7) var<storage, read> plan: array<u32>;

var<workgroup> lanes_acc: array<f32, 512>;  // TILE x 64 threads
var<workgroup> lanes_min: array<f32, 512>;
// the tile's activations of one step (STEP sub-blocks of TILE rows): quants, scales, sums
const STEP: u32 = 8u;
var<workgroup> tq: array<vec4<f32>, 512>;  // TILE x STEP x 8
var<workgroup> td: array<f32, 64>;         // TILE x STEP
var<workgroup> ts: array<f32, 64>;
var<workgroup> th: array<f32, 64>;

// Activation sub-block g (global index) of the step's tile copy at t (b * STEP + c): from
// workgroup memory when LANES > 1 (GPUs), straight from the buffers on software adapters, where the
// barriers cost more than the copy saves (the same values either way).
fn aq(t: u32, g: u32, k: u32) -> vec4<f32> {
    if LANES > 1u {
        return tq[8u * t + k];
    }
    return xq[8u * g + k];
}

fn ad(t: u32, g: u32) -> f32 {
    if LANES > 1u {
        return td[t];
    }
    return xd[g];
}

fn as_(t: u32, g: u32) -> f32 {
    if LANES > 1u {
        return ts[t];
    }
    return xs[g];
}

fn ah(t: u32, g: u32) -> f32 {
    if LANES > 1u {
        return th[t];
    }
    return xh[g];
}

fn is_float(fmt: u32) -> bool {
    return fmt == T_F32 || fmt == T_F16 || fmt == T_BF16;
}

fn hsum8_at(a: ptr<function, array<f32, 64>>, o: u32) -> f32 {
    return (((*a)[o] + (*a)[o + 4u]) + ((*a)[o + 2u] + (*a)[o + 6u]))
        + (((*a)[o + 1u] + (*a)[o + 5u]) + ((*a)[o + 3u] + (*a)[o + 7u]));
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
//#if subgroups
    @builtin(subgroup_invocation_id) sg_lane: u32,
//#endif
) {
    let per = 8u / LANES;  // lanes this thread runs
    let lane0 = (lid % LANES) * per;
    let r = (wg.x + wg.y * p.groups_x) * (64u / LANES) + lid / LANES;
    // act[b] / dst_row[b]: the activation and output row of tile slot b; wr: the weight row in the binding
    var act: array<u32, 8>;
    var dst_row: array<u32, 8>;
    var n_b = 0u;
    var wr = r;
    var col = p.row0 + r;
    var live = r < p.rows;
    if MOE == 0u {
        let b0 = wg.z * TILE;
        n_b = min(TILE, p.n_act - b0);
        for (var b = 0u; b < TILE; b++) {
            act[b] = b0 + b;
            dst_row[b] = b0 + b;
        }
    } else {
        let t = p.tiles_at + 4u * (p.tile0 + wg.z);
        let g = plan[t] * p.stride + p.offset + r;  // the expert's row r in the whole tensor
        n_b = plan[t + 2u];
        live = live && g >= p.row0 && g < p.row0 + p.chunk_rows;
        wr = g - p.row0;
        col = r;
        for (var b = 0u; b < TILE; b++) {
            let pair = plan[plan[t + 1u] + min(b, max(n_b, 1u) - 1u)];
            act[b] = pair / p.act_div;
            dst_row[b] = pair;
        }
    }
    // acc[8 * b + kk], mins[8 * b + kk]: activation row b, this thread's kk-th lane
    var acc: array<f32, 64>;
    var mins: array<f32, 64>;
    for (var i = 0u; i < 64u; i++) {
        acc[i] = 0.0;
        mins[i] = 0.0;
    }
    let row = wr * p.row_bytes;
    // Steps of STEP sub-blocks (one K-quant super-block): on GPUs the workgroup first copies the
    // tile's activations of the step into workgroup memory (read once for all its weight rows); then
    // each thread adds the step's blocks to its lanes, block after block: every output keeps the
    // decode order, whatever the batch or chunk.
    for (var s0 = 0u; s0 < p.n_sub; s0 += STEP) {
        let n_c = min(STEP, p.n_sub - s0);
        if LANES > 1u {
            workgroupBarrier();  // the previous step's reads are done
            for (var i = lid; i < TILE * STEP * 8u; i += 64u) {
                let b = i / (STEP * 8u);
                let c = (i / 8u) % STEP;
                if b < n_b && c < n_c {
                    tq[i] = xq[8u * (act[b] * p.n_sub + s0 + c) + i % 8u];
                }
            }
            for (var i = lid; i < TILE * STEP; i += 64u) {
                let b = i / STEP;
                let c = i % STEP;
                if b < n_b && c < n_c {
                    let a = act[b] * p.n_sub + s0 + c;
                    td[i] = xd[a];
                    ts[i] = xs[a];
                    th[i] = xh[a];
                }
            }
            workgroupBarrier();
        }
        if live {
            for (var kk = 0u; kk < per; kk++) {
                let k = lane0 + kk;
                if is_float(FMT) {
                    for (var c = 0u; c < n_c; c++) {
                        let wv = quad_f(FMT, row, 32u * (s0 + c) + 4u * k, p.cols);
                        for (var b = 0u; b < TILE; b++) {
                            if b < n_b {
                                let xv = aq(b * STEP + c, act[b] * p.n_sub + s0 + c, k);
                                var a = acc[8u * b + kk];
                                a = fma(wv.x, xv.x, a);
                                a = fma(wv.y, xv.y, a);
                                a = fma(wv.z, xv.z, a);
                                acc[8u * b + kk] = fma(wv.w, xv.w, a);
                            }
                        }
                    }
                } else if FMT == T_Q4_K || FMT == T_Q5_K || FMT == T_Q6_K {
                    let size = block_bytes(FMT);
                    let sb = s0 / 8u;
                    let blk = row + size * sb;
                    var qs: array<vec4<i32>, 8>;
                    var sc: array<i32, 8>;  // Q4_K/Q5_K: the sub-block scales; Q6_K: lane k's scale per chunk
                    var m: array<i32, 8>;
                    for (var c = 0u; c < 8u; c++) {
                        qs[c] = quad_q(FMT, row, 256u * sb + 32u * c + 4u * k);
                        if FMT == T_Q6_K {
                            sc[c] = i32(i8_at(blk + 192u + 2u * c + k / 4u));
                        } else {
                            let sm = scale_min_k4(blk + 4u, c);
                            sc[c] = i32(sm.x);
                            m[c] = i32(sm.y);
                        }
                    }
                    var dw = f16_at(blk);
                    if FMT == T_Q6_K {
                        dw = f16_at(blk + 208u);
                    }
                    for (var b = 0u; b < TILE; b++) {
                        if b < n_b {
                            let a0 = b * STEP;  // the super-block's first sub-block: in the tile copy,
                            let g0 = act[b] * p.n_sub + s0;  // in the buffers
                            var lane = 0;
                            if FMT == T_Q6_K {
                                let own = a0 + k;  // 16-sums 2k, 2k+1 are sub-block k's halves
                                let s0q = i32(i8_at(blk + 192u + 2u * k));
                                let s1q = i32(i8_at(blk + 192u + 2u * k + 1u));
                                lane = -32 * (i32(as_(own, g0 + k)) * s0q + i32(ah(own, g0 + k)) * s1q);
                            }
                            for (var c = 0u; c < 8u; c++) {
                                lane += sc[c] * dot(qs[c], vec4<i32>(aq(a0 + c, g0 + c, k)));
                            }
                            let yd = ad(a0, g0);
                            acc[8u * b + kk] = fma_exact(dw * yd, f32(lane), acc[8u * b + kk]);
                            if FMT != T_Q6_K && (k < 4u && FMT == T_Q4_K || k == 0u) {
                                // mins: lane l < 4 holds sub-blocks 2l, 2l+1 (Q4_K); Q5_K all in lane 0
                                let dmin = -yd * f16_at(blk + 2u);
                                var prod: array<i32, 4>;
                                for (var l = 0u; l < 4u; l++) {
                                    let j = 2u * l;
                                    prod[l] = m[j] * (i32(as_(a0 + j, g0 + j)) + i32(ah(a0 + j, g0 + j)))
                                        + m[j + 1u] * (i32(as_(a0 + j + 1u, g0 + j + 1u)) + i32(ah(a0 + j + 1u, g0 + j + 1u)));
                                }
                                var term = prod[min(k, 3u)];
                                if FMT == T_Q5_K {
                                    term = (prod[0] + prod[1]) + (prod[2] + prod[3]);
                                }
                                mins[8u * b + kk] = fma_exact(dmin, f32(term), mins[8u * b + kk]);
                            }
                        }
                    }
                } else {
                    // legacy 32-blocks: Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1, Q5_1 against Q8_1 (+ m * s)
                    let size = block_bytes(FMT);
                    let with_min = FMT == T_Q4_1 || FMT == T_Q5_1;
                    for (var c = 0u; c < n_c; c++) {
                        let blk = row + size * (s0 + c);
                        let q = quad_q(FMT, row, 32u * (s0 + c) + 4u * k);
                        let dw = f16_at(blk);
                        let mw = f16_at(blk + 2u);
                        for (var b = 0u; b < TILE; b++) {
                            if b < n_b {
                                let a = b * STEP + c;
                                let g = act[b] * p.n_sub + s0 + c;
                                let i = 8u * b + kk;
                                acc[i] = fma_exact(dw * ad(a, g), f32(dot(q, vec4<i32>(aq(a, g, k)))), acc[i]);
                                if with_min && k == 0u {
                                    mins[i] += mw * as_(a, g);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if LANES > 1u {
        // one lane per thread: gather the row's eight lanes for lane 0, by subgroup shuffles where
        // the adapter has them (a row's eight threads share a subgroup: features.rs probes it),
        // else through workgroup memory
//#if subgroups
        let first = sg_lane - sg_lane % 8u;
        for (var b = 0u; b < TILE; b++) {
            let own_acc = acc[8u * b];
            let own_min = mins[8u * b];
            for (var kk = 0u; kk < 8u; kk++) {
                acc[8u * b + kk] = subgroupShuffle(own_acc, first + kk);
                mins[8u * b + kk] = subgroupShuffle(own_min, first + kk);
            }
        }
//#else
        for (var b = 0u; b < TILE; b++) {
            lanes_acc[b * 64u + lid] = acc[8u * b];
            lanes_min[b * 64u + lid] = mins[8u * b];
        }
        workgroupBarrier();
        if lane0 == 0u {
            for (var b = 0u; b < TILE; b++) {
                for (var kk = 0u; kk < 8u; kk++) {
                    acc[8u * b + kk] = lanes_acc[b * 64u + lid + kk];
                    mins[8u * b + kk] = lanes_min[b * 64u + lid + kk];
                }
            }
        }
//#endif
    }
    if lane0 == 0u && live {
        for (var b = 0u; b < TILE; b++) {
            if b < n_b {
                var mn = mins[8u * b];
                if FMT == T_Q4_K {
                    mn = (mins[8u * b] + mins[8u * b + 2u]) + (mins[8u * b + 1u] + mins[8u * b + 3u]);
                }
                y[dst_row[b] * p.out_cols + col] = hsum8_at(&acc, 8u * b) + mn;
            }
        }
    }
}
