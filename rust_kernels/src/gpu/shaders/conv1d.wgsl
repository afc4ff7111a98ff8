// Depthwise causal convolution with carried state (ggml_ssm_conv), as Gated DeltaNet and Mamba2 use
// it. The input sequence is the state's K-1 raw rows (oldest first) followed by x (n x channels).
// Entry `main`: out[t, c] = sum_k w[c, k] * in[t + k, c], tap 0 first, added as the CPU kernel adds
// them (rounded products while the CPU does, fused multiply-adds for its tail taps), then + bias,
// then SiLU (ggml's expf). The new state, the last K-1 raw input rows, is written by `main`'s
// invocations of the last token (whose taps read exactly those rows), or with no tokens by entry
// `state`. One invocation per output value; no reductions across invocations. Needs math.wgsl.

struct Params {
    n: u32,         // tokens
    channels: u32,
    kernel: u32,
    has_bias: u32,
    silu: u32,
    fused_from: u32, // taps from here on are fused multiply-adds (the CPU's order)
    total: u32,      // invocations wanted
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;     // channels x kernel
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read> state_in: array<f32>; // (kernel-1) x channels
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> state_out: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

fn input(r: u32, c: u32) -> f32 {
    let km1 = p.kernel - 1u;
    if r < km1 {
        return state_in[r * p.channels + c];
    }
    return x[(r - km1) * p.channels + c];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let idx = g.x + g.y * p.groups_x * 64u;
    if idx >= p.total {
        return;
    }
    let t = idx / p.channels;
    let c = idx % p.channels;
    var s = 0.0;
    for (var k = 0u; k < p.kernel; k++) {
        let v = input(t + k, c);
        let wk = w[c * p.kernel + k];
        if k < p.fused_from {
            // the CPU rounds this product: `mul_soft`, since a driver may fuse `v * wk` into the add
            s = s + mul_soft(v, wk);
        } else {
            s = fma(v, wk, s);
        }
    }
    if p.has_bias != 0u {
        s = s + bias[c];
    }
    if p.silu != 0u {
        s = div_rn(s, 1.0 + expf_ggml(-s));
    }
    out[idx] = s;
    if t + 1u == p.n {
        // the new state: rows n .. n+K-2 of the input, the last token's taps after its first
        for (var i = 0u; i + 1u < p.kernel; i++) {
            state_out[i * p.channels + c] = input(p.n + i, c);
        }
    }
}

@compute @workgroup_size(64)
fn state(@builtin(global_invocation_id) g: vec3<u32>) {
    let idx = g.x + g.y * p.groups_x * 64u;
    if idx >= p.total {
        return;
    }
    let i = idx / p.channels;
    let c = idx % p.channels;
    state_out[idx] = input(p.n + i, c);
}
