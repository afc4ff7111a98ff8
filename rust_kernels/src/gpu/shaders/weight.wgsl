// The weight that quant.wgsl reads: one tensor's bytes at binding 0, as u32 words.

@group(0) @binding(0) var<storage, read> w: array<u32>;

fn wword(i: u32) -> u32 {
    return w[i];
}
