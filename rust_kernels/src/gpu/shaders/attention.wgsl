// Attention of one sequence's query rows over its KV cache on the device.
// The cache holds K and V as f16 pairs packed in u32 words: [position][kv head][head_dim / 2],
// cache index == token position. Entry `store` writes new K/V rows; entry `attend` computes, per
// (query row, head), softmax(q·k * kq_scale) · v over the keys the row may see: causal, and with a
// window only the last `window` positions. One workgroup per (row, head), three passes (scores,
// exponentials, weighted V), fixed sequential and tree reduction orders: results are deterministic
// and do not depend on the other rows of the batch. As on the CPU (llama.cpp's F16 path), q is
// rounded to f16 for the scores, ggml's exp, and the probabilities to f16 for the sum of V.
// Needs math.wgsl and f64.wgsl.

struct Params {
    n_rows: u32,     // query rows of this sequence
    row0: u32,       // their first row in q / out (and in k, v for `store`)
    n_head: u32,
    n_kv: u32,
    head_dim: u32,
    window: u32,     // 0: none
    _unused: u32,    // (cache positions are the rows' positions)
    n_ctx: u32,      // keys per scratch row
    kq_scale: f32,
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;    // attend: rows x n_head x head_dim; store: new K
@group(0) @binding(1) var<storage, read> vnew: array<f32>; // store: new V
@group(0) @binding(2) var<storage, read_write> kc: array<u32>;
@group(0) @binding(3) var<storage, read_write> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;     // attend: rows x n_head*head_dim
@group(0) @binding(5) var<storage, read_write> scratch: array<f32>; // attend: n_rows x n_head x n_ctx
@group(0) @binding(6) var<uniform> p: Params;
@group(0) @binding(7) var<storage, read> positions: array<i32>; // attend: position of each q row
@group(0) @binding(8) var<storage, read_write> group_sums: array<f32>; // attend: per 8 keys

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn store(@builtin(global_invocation_id) g: vec3<u32>) {
    let pairs = p.n_kv * p.head_dim / 2u;
    let idx = g.x + g.y * 65535u * 64u;
    if idx >= p.n_rows * pairs {
        return;
    }
    let r = idx / pairs;
    let j = idx % pairs;
    let src = (p.row0 + r) * pairs * 2u + 2u * j;
    let dst = u32(positions[p.row0 + r]) * pairs + j;  // cache index == token position
    kc[dst] = pack_f16x2(q[src], q[src + 1u]);
    vc[dst] = pack_f16x2(vnew[src], vnew[src + 1u]);
}

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            red[lid] = max(red[lid], red[lid + stride]);
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

// ggml's 8-lane horizontal sum: ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)).
fn hsum8(x: array<f32, 8>) -> f32 {
    return ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]));
}

// The CPU's order throughout (see rust_kernels/src/attention/): a score is 8 lanes of fused
// products over head dims (lane = dim % 8) joined by hsum8; the exponentials are summed in groups
// of 8 keys aligned to position 0 (hsum8), the groups in key order; each output dim is 8 lanes over
// keys (lane = key % 8) joined by hsum8.
@compute @workgroup_size(64)
fn attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wg.x;
    let h = wg.y;
    let hd = p.head_dim;
    let kvh = h / (p.n_head / p.n_kv);
    let qpos = u32(positions[p.row0 + r]);
    var first = 0u;
    if p.window > 0u && qpos + 1u > p.window {
        first = qpos + 1u - p.window;
    }
    let qo = ((p.row0 + r) * p.n_head + h) * hd;
    let so = (r * p.n_head + h) * p.n_ctx;  // scratch index of key position j: so + j
    let words = p.n_kv * hd / 2u;
    let kvo = kvh * hd / 2u;

    // scores of keys first..qpos
    var m = -3.4e38;
    for (var j = first + lid; j <= qpos; j += 64u) {
        var lanes: array<f32, 8>;
        for (var c = 0u; c < hd / 8u; c++) {
            for (var l = 0u; l < 8u; l += 2u) {
                let k2 = unpack2x16float(kc[j * words + kvo + 4u * c + l / 2u]);
                lanes[l] = fma_exact(k2.x, to_f16(q[qo + 8u * c + l]), lanes[l]);
                lanes[l + 1u] = fma_exact(k2.y, to_f16(q[qo + 8u * c + l + 1u]), lanes[l + 1u]);
            }
        }
        let s = hsum8(lanes) * p.kq_scale;
        scratch[so + j] = s;
        m = max(m, s);
    }
    m = reduce_max(lid, m);
    storageBarrier();
    workgroupBarrier();
    // exponentials, and their sum per group of 8 keys (one thread then adds the groups in order)
    let g_first = first / 8u;
    let g_last = qpos / 8u;
    for (var g = g_first + lid; g <= g_last; g += 64u) {
        var lanes: array<f32, 8>;
        for (var l = 0u; l < 8u; l++) {
            let j = 8u * g + l;
            if j >= first && j <= qpos {
                let e = expf_ggml(scratch[so + j] - m);
                scratch[so + j] = e;
                lanes[l] = e;
            }
        }
        group_sums[(r * p.n_head + h) * (p.n_ctx / 8u + 1u) + g] = hsum8(lanes);
    }
    storageBarrier();
    workgroupBarrier();
    if lid == 0u {
        // the CPU adds the group sums in f64 and takes (f32)(1 / sum): emulated exactly (f64.wgsl)
        var sum = f64_zero();
        for (var g = g_first; g <= g_last; g++) {
            sum = f64_add(sum, f64_of(group_sums[(r * p.n_head + h) * (p.n_ctx / 8u + 1u) + g]));
        }
        red[0] = recip_f32(sum);
    }
    workgroupBarrier();
    let inv = red[0];
    for (var d = lid; d < hd; d += 64u) {
        var lanes: array<f32, 8>;
        for (var g = g_first; g <= g_last; g++) {
            for (var l = 0u; l < 8u; l++) {
                let j = 8u * g + l;
                if j >= first && j <= qpos {
                    let v2 = unpack2x16float(vc[j * words + kvo + d / 2u]);
                    lanes[l] = fma_exact(to_f16(scratch[so + j] * inv), select(v2.x, v2.y, (d & 1u) == 1u), lanes[l]);
                }
            }
        }
        out[qo + d] = hsum8(lanes);
    }
}
