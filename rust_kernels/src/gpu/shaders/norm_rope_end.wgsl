// norm.wgsl's end when its groups are the heads of q or k and RoPE follows (as in Gemma 3, qwen3
// and the qwen hybrids): the workgroup turns the head it has just written, in place in y, by
// rope.wgsl's formula and table (rope_pair.wgsl). Each pair is read back after the barrier and
// turned by one thread, so y holds the bits of the norm and then a separate RoPE pass.
// Group `row` is head row % p.rope_heads of token row / p.rope_heads.

@group(0) @binding(9) var<storage, read> angles: array<vec2<f32>>;  // token x pair: (cos, sin)

fn after_norm(row: u32, lid: u32) {
    storageBarrier();  // the head's values were written by the other threads of this workgroup
    let half = p.n_rot / 2u;
    let token = row / p.rope_heads;
    for (var i = lid; i < half; i += 64u) {
        let d = rope_dims(row * p.n, i, half, p.neox != 0u);
        let r = rope_pair(vec2<f32>(y[d.x], y[d.y]), angles[token * half + i]);
        y[d.x] = r.x;
        y[d.y] = r.y;
    }
}
