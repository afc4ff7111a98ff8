// norm.wgsl's end for a gated output (the qwen hybrids' delta-net norm, then `y *= silu(z)`):
// each thread multiplies the values it has just written by silu of the gate at the same place, as
// elementwise.wgsl's `dst = silu(a) * dst` does, so y holds the bits of the norm and then that
// pass. Needs activations.wgsl. Contiguous rows only (the gate is indexed as y).

@group(0) @binding(9) var<storage, read> gate: array<f32>;

fn after_norm(row: u32, lid: u32) {
    for (var i = lid; i < p.n; i += 64u) {
        let at = row * p.n + i;
        y[at] = silu(gate[at]) * y[at];
    }
}
