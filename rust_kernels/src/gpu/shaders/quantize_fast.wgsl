// Fast numerics: activations quantized for the quantized formats' dot products
// (quantize_fast_core.wgsl), a workgroup per 256 values of a row, read by `act_in` from
// quantize_in.wgsl (the activations) or gated_in.wgsl (a gated unit computed on the way). Needs
// math.wgsl and quantize_fast_core.wgsl.

struct Params {
    n: u32,        // rows
    cols: u32,
    n_sub: u32,    // sub-blocks of 32 per row (cols rounded up)
    groups_x: u32,
}

@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let chunks = (p.n_sub + 7u) / 8u;  // 256 values of a row per workgroup
    let idx = wg.x + wg.y * p.groups_x;
    if idx >= p.n * chunks {
        return;
    }
    quantize_256(idx / chunks, idx % chunks, p.n_sub, p.cols, lid);
}
