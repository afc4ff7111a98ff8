// Activations as the CPU kernels (and llama.cpp) feed them to a weight format's dot product, so
// that the device computes the same integer dot products: ACT
//   0 f32 as is (F32 weights)      1 rounded to f16 (F16)      2 rounded to bf16 (BF16)
//   3 Q8_0 (legacy formats)        4 Q8_1 (Q4_1, Q5_1)         5 Q8_K (K-quants, 256-blocks)
// Output per 32-value sub-block: xq = the quants (or rounded values), xd = their scale,
// xs = Q8_1: f16(d * sum(q)); Q8_K: the sum of the first 16 quants, xh: of the last 16.
// One invocation per (row, block of 32, or of 256 for Q8_K).

override ACT: u32 = 0u;

struct Params {
    n: u32,        // rows
    cols: u32,
    n_sub: u32,    // sub-blocks of 32 per row (cols rounded up)
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> xq: array<f32>;  // n x n_sub*32
@group(0) @binding(2) var<storage, read_write> xd: array<f32>;  // n x n_sub
@group(0) @binding(3) var<storage, read_write> xs: array<f32>;  // n x n_sub
@group(0) @binding(4) var<storage, read_write> xh: array<f32>;  // n x n_sub
@group(0) @binding(5) var<uniform> p: Params;

fn to_f16(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}

fn to_bf16(v: f32) -> f32 {
    // round to nearest even on the upper 16 bits
    let b = bitcast<u32>(v);
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

fn value(row: u32, e: u32) -> f32 {
    return select(0.0, x[row * p.cols + e], e < p.cols);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let per = select(1u, 8u, ACT == 5u);  // sub-blocks per quantization block
    let blocks = (p.n_sub + per - 1u) / per;
    let idx = g.x + g.y * p.groups_x * 64u;
    if idx >= p.n * blocks {
        return;
    }
    let row = idx / blocks;
    let s0 = (idx % blocks) * per;
    let n_sub = min(per, p.n_sub - s0);
    let base = row * p.n_sub;
    if ACT <= 2u {
        let e0 = 32u * s0;
        for (var i = 0u; i < 32u; i++) {
            var v = value(row, e0 + i);
            if ACT == 1u {
                v = to_f16(v);
            } else if ACT == 2u {
                v = to_bf16(v);
            }
            xq[(base + s0) * 32u + i] = v;
        }
        xd[base + s0] = 1.0;
        xs[base + s0] = 0.0;
        return;
    }
    if ACT == 5u {
        // signed max (the first of the largest magnitude), iscale = -127 / max, d = 1 / iscale
        var amax = 0.0;
        var mx = 0.0;
        for (var i = 0u; i < 32u * n_sub; i++) {
            let v = value(row, 32u * s0 + i);
            if abs(v) > amax {
                amax = abs(v);
                mx = v;
            }
        }
        var iscale = 0.0;
        var d = 0.0;
        if amax != 0.0 {
            iscale = -div_exact(127.0, mx);
            d = div_exact(1.0, iscale);
        }
        for (var k = 0u; k < n_sub; k++) {
            var sums = vec2<f32>(0.0);
            for (var i = 0u; i < 32u; i++) {
                let q = min(127.0, round(iscale * value(row, 32u * (s0 + k) + i)));
                xq[(base + s0 + k) * 32u + i] = q;
                sums[i / 16u] += q;
            }
            xd[base + s0 + k] = d;
            xs[base + s0 + k] = sums.x;
            xh[base + s0 + k] = sums.y;
        }
        return;
    }
    // Q8_0 / Q8_1: d = amax / 127 (stored as f16), q = round(v * 127 / amax)
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(value(row, 32u * s0 + i)));
    }
    let d = div_exact(amax, 127.0);
    let id = select(0.0, div_exact(127.0, amax), amax != 0.0);
    var sum = 0.0;
    for (var i = 0u; i < 32u; i++) {
        let q = round(value(row, 32u * s0 + i) * id);
        xq[(base + s0) * 32u + i] = q;
        sum += q;
    }
    xd[base + s0] = to_f16(d);
    xs[base + s0] = select(to_f16(d) * sum, to_f16(d * sum), ACT == 4u);
}
