// One rotary pair, as rope.wgsl and norm_rope_end.wgsl turn it: the dims of pair i of a head,
// and the rotation by the host's (cos, sin) with the CPU's fused multiply-adds. Needs math.wgsl
// (fma_exact).

// the dims of pair i of the head starting at o: (2i, 2i+1), or (i, i + half) with NEOX
fn rope_dims(o: u32, i: u32, half: u32, neox: bool) -> vec2<u32> {
    if neox {
        return vec2<u32>(o + i, o + i + half);
    }
    return vec2<u32>(o + 2u * i, o + 2u * i + 1u);
}

// (x0, x1) turned by the angle whose (cos, sin) is cs
fn rope_pair(x: vec2<f32>, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(fma_exact(x.x, cs.x, -(x.y * cs.y)), fma_exact(x.x, cs.y, x.y * cs.x));
}
