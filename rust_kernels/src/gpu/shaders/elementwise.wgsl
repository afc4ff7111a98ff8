// Element-wise operations, chosen by the override constant OP:
//   0 dst += a        1 dst *= a        2 dst *= s          3 dst[i] += a[i % m] (a row vector)
//   4 dst = gelu(a) * b (GEGLU)        5 dst = silu(a) * b (SwiGLU)
//   6 dst = s * tanh(dst / s) (soft cap)                    7 dst = silu(dst)
//   8 dst = silu(a) * dst (a gated output; the bits of dst *= silu(a), without silu(a)'s copy)
// Needs math.wgsl and activations.wgsl (GELU's table at binding 4, SiLU).

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
