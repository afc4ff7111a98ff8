// Element-wise operations, chosen by the override constant OP:
//   0 dst += a        1 dst *= a        2 dst *= s          3 dst[i] += a[i % m] (a row vector)
//   4 dst = gelu(a) * b (GEGLU)        5 dst = silu(a) * b (SwiGLU)
//   6 dst = s * tanh(dst / s) (soft cap)                    7 dst = silu(dst)
//   8 dst = silu(a) * dst (a gated output; the bits of dst *= silu(a), without silu(a)'s copy)
// Needs math.wgsl.

override OP: u32 = 0u;

struct Params {
    n: u32,
    m: u32,
    s: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read_write> dst: array<f32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
// OP 4: ggml's GELU table, the CPU kernel's own (65536 f16 values as f32, by f16 bit pattern)
@group(0) @binding(4) var<storage, read> gelu_table: array<f32>;

// ggml's CPU GELU: the tanh approximation looked up at the input rounded to f16, stored as f16;
// the identity past 10, zero below -10. The table comes from the host: a shader's tanh differs.
fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    return gelu_table[f16_bits(x)];
}

fn silu(x: f32) -> f32 {
    return div_rn(x, 1.0 + expf_ggml(-x));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x + g.y * p.groups_x * 64u;
    if i >= p.n {
        return;
    }
    switch OP {
        case 0u: { dst[i] = dst[i] + a[i]; }
        case 1u: { dst[i] = dst[i] * a[i]; }
        case 2u: { dst[i] = dst[i] * p.s; }
        case 3u: { dst[i] = dst[i] + a[i % p.m]; }
        case 4u: { dst[i] = gelu(a[i]) * b[i]; }
        case 5u: { dst[i] = silu(a[i]) * b[i]; }
        case 6u: { dst[i] = p.s * tanh(div_rn(dst[i], p.s)); }
        case 7u: { dst[i] = silu(dst[i]); }
        case 8u: { dst[i] = silu(a[i]) * dst[i]; }
        default: {}
    }
}
