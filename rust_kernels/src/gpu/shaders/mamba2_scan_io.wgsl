// The Mamba2 scan's sizes, bindings and dt's softplus, shared by its kernels (mamba2_scan.wgsl in
// exact numerics, mamba2_scan_fast.wgsl in fast).

struct Params {
    n: u32,       // tokens: this dispatch runs tokens t0 .. n
    nh: u32,      // heads H
    hd: u32,      // head_dim P
    ng: u32,      // groups G
    ns: u32,      // d_state N
    groups_x: u32,
    t0: u32,      // the first token this dispatch runs (past 0: it continues from state_out)
    _b: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;      // n x H x P
@group(0) @binding(1) var<storage, read> dt: array<f32>;     // n x H
@group(0) @binding(2) var<storage, read> bmat: array<f32>;   // n x G x N
@group(0) @binding(3) var<storage, read> cmat: array<f32>;   // n x G x N
@group(0) @binding(4) var<storage, read> heads: array<f32>;  // A (H), then D (H), then dt_bias (H)
@group(0) @binding(5) var<storage, read> state_in: array<f32>;        // H x P x N
@group(0) @binding(6) var<storage, read_write> state_out: array<f32>; // H x P x N
@group(0) @binding(7) var<storage, read_write> out: array<f32>;       // n x H x P
@group(0) @binding(8) var<uniform> p: Params;

fn softplus(v: f32) -> f32 {
    if v > 20.0 {
        return v;
    }
    return log(1.0 + exp(v));
}
