// RMSNorm of each row of n elements, times a weight of length n (or not):
// y = x * (1 / sqrt(mean(x^2) + eps)) * w. One workgroup per row. The rows may be groups of n
// columns at the start of wider input rows (`per_row` groups in each x row of `x_stride` values,
// as the q and k heads at the start of a delta-net layer's convolution output); y is contiguous.
// The input x and `take_x` come from norm_io.wgsl (read only), norm_add_io.wgsl (the residual
// norm: x += a, written back, then normalised: one pass instead of an add and a norm) or
// norm_gated_io.wgsl (x *= silu(z), written back, then normalised: Mamba2's gated norm, whose
// weight spans the groups of a row: `weight_groups`).
// `after_norm` comes from norm_end.wgsl (nothing), norm_quantize_end.wgsl (the row just written
// quantized for the matmul it feeds: one pass instead of a norm and a quantization) or
// norm_rope_end.wgsl (the head just written turned by RoPE: one pass instead of a norm and a RoPE).
//
// The CPU (as ggml) squares in f32 and sums the squares in f64, which shaders lack. Here each
// square is added exactly into a 320-bit fixed-point integer (unit 2^-149, the least f32), the
// threads' integers are joined exactly, and the mean is rounded to f32 once. That equals the
// CPU's f32 mean unless its f64 sum's rounding errors (< n * 2^-53 relative) straddle an f32
// rounding point: about n * 2^-29 of rows (1e-6 for n = 640). Exact integer sums also make the
// result independent of the thread count and of the compiler's float reassociation.
// Fast numerics: each thread sums its strided squares in f32 with `fma`, the 64 partial sums are
// joined in a fixed tree; the same order for every row, whatever its batch.
// Needs math.wgsl (u64 helpers, round_to_f32).

const LIMBS: u32 = 10u;

struct Params {
    n: u32,
    rows: u32,
    eps: f32,
    has_weight: u32,
    groups_x: u32,
    per_row: u32,
    x_stride: u32,
    weight_groups: u32,  // groups one weight spans (its length: n times this); 1: each group's own
    rope_heads: u32,  // norm_rope_end.wgsl: heads per token, rotated dims, NEOX pairs
    n_rot: u32,
    neox: u32,
    _d: u32,
}

@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// where row `row`'s values start in x
fn x_base(row: u32) -> u32 {
    return (row / p.per_row) * p.x_stride + (row % p.per_row) * p.n;
}

//#if exact
var<workgroup> partial: array<u32, 640>;  // 64 threads x LIMBS
var<workgroup> nonfinite: array<f32, 64>;  // the plain sum of inf/NaN squares (the CPU's result then)
//#else
var<workgroup> partial_f32: array<f32, 64>;
//#endif
var<workgroup> row_scale: f32;

// acc += v << shift at limb `limb` (v < 2^32, shift < 32), carrying through the higher limbs
fn add_at(acc: ptr<function, array<u32, 10>>, limb: u32, v: u32, shift: u32) {
    let lo = v << shift;
    let s = (*acc)[limb] + lo;
    (*acc)[limb] = s;
    var carry = select(0u, 1u, s < lo);
    var add = select(0u, v >> (32u - shift), shift > 0u);
    for (var i = limb + 1u; i < LIMBS && (add | carry) != 0u; i++) {
        let t = (*acc)[i] + add;
        let t2 = t + carry;
        carry = select(0u, 1u, t < add) + select(0u, 1u, t2 < t);
        (*acc)[i] = t2;
        add = 0u;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.groups_x;
//#if exact
    var acc: array<u32, 10>;
    for (var l = 0u; l < LIMBS; l++) {
        acc[l] = 0u;
    }
    var bad = 0.0;
    if row < p.rows {
        for (var i = lid; i < p.n; i += 64u) {
            let v = take_x(x_base(row) + i);
            let sq = v * v;
            let u = unpack_f32(sq);
            if ((bitcast<u32>(sq) >> 23u) & 0xffu) == 0xffu {
                bad += sq;
            } else if u.mant != 0u {
                let at = u32(u.exp + 149);  // bit offset of the mantissa in units of 2^-149
                add_at(&acc, at / 32u, u.mant, at % 32u);
            }
        }
    }
    for (var l = 0u; l < LIMBS; l++) {
        partial[lid * LIMBS + l] = acc[l];
    }
    nonfinite[lid] = bad;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            var carry = 0u;
            for (var l = 0u; l < LIMBS; l++) {
                let a = partial[lid * LIMBS + l];
                let b = partial[(lid + stride) * LIMBS + l];
                let s = a + b;
                let s2 = s + carry;
                carry = select(0u, 1u, s < a) + select(0u, 1u, s2 < s);
                partial[lid * LIMBS + l] = s2;
            }
            nonfinite[lid] += nonfinite[lid + stride];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        // the top 64 bits of the sum (the lower ones only as "some"), divided by n in 16-bit steps
        var top = -1;
        for (var l = 0u; l < LIMBS; l++) {
            if partial[l] != 0u {
                top = i32(32u * l + 31u - countLeadingZeros(partial[l]));
            }
        }
        var mean = 0.0;
        if top >= 0 {
            // the sum's 64 leading bits (value t * 2^e; lower bits only as "some were lost"),
            // then t / n in 16-bit steps: a quotient of >= 47 bits plus a sticky bit
            let shift = top - 63;
            var t = vec2<u32>(0u, 0u);
            var lost = false;
            for (var l = 0u; l < LIMBS; l++) {
                let base = i32(32u * l) - shift;  // where limb l's bit 0 lands in t
                let w = partial[l];
                if w == 0u || base >= 64 {
                    continue;
                }
                if base >= 0 {
                    t = u64_add(t, u64_shl(vec2<u32>(0u, w), u32(base)));
                } else if base > -32 {
                    t = u64_add(t, vec2<u32>(0u, w >> u32(-base)));
                    lost = lost || (w << u32(32 + base)) != 0u;
                } else {
                    lost = true;
                }
            }
            let t16 = array<u32, 4>(t.x >> 16u, t.x & 0xffffu, t.y >> 16u, t.y & 0xffffu);
            var q: array<u32, 4>;
            var r = 0u;
            for (var d = 0u; d < 4u; d++) {
                let cur = (r << 16u) | t16[d];
                q[d] = cur / p.n;
                r = cur % p.n;
            }
            var qs = vec2<u32>((q[0] << 16u) | q[1], (q[2] << 16u) | q[3]);
            if r != 0u || lost {
                qs.y |= 1u;
            }
            mean = round_to_f32(qs, -149 + shift, false);
        }
        if (bitcast<u32>(nonfinite[0]) & 0x7f800000u) == 0x7f800000u {
            mean = nonfinite[0];
        }
        row_scale = div_rn(1.0, sqrt_rn(mean + p.eps));
    }
//#else
    var acc = 0.0;
    if row < p.rows {
        for (var i = lid; i < p.n; i += 64u) {
            let v = take_x(x_base(row) + i);
            acc = fma(v, v, acc);
        }
    }
    partial_f32[lid] = acc;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            partial_f32[lid] += partial_f32[lid + stride];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        row_scale = 1.0 / sqrt(partial_f32[0] / f32(p.n) + p.eps);
    }
//#endif
    workgroupBarrier();
    if row >= p.rows {
        return;
    }
    let scale = row_scale;
    let w_base = (row % p.weight_groups) * p.n;
    for (var i = lid; i < p.n; i += 64u) {
        var v = x[x_base(row) + i] * scale;
        if p.has_weight != 0u {
            v *= weight[w_base + i];
        }
        y[row * p.n + i] = v;
    }
    after_norm(row, lid);
}
