// GELU and SiLU as the CPU kernels compute them (elementwise.wgsl, gated_in.wgsl). Needs math.wgsl.

// GELU: ggml's table, the CPU kernel's own (65536 f16 values as f32, by f16 bit pattern)
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
