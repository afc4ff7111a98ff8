// norm.wgsl's end in fast numerics when the norm feeds quantized matmuls: the workgroup quantizes
// the row it has just written (quantize_fast_core.wgsl), 256 values at a time, reading them back
// from y. Each value is the bits a separate quantize_fast.wgsl pass would read, so the quants are
// that pass's bits; the rows are contiguous rows of n (p.per_row is 1).

fn act_in(at: u32) -> f32 {
    return y[at];
}

fn after_norm(row: u32, lid: u32) {
    storageBarrier();  // the row's values were written by the other threads of this workgroup
    let n_sub = (p.n + 31u) / 32u;
    for (var chunk = 0u; chunk < (n_sub + 7u) / 8u; chunk++) {
        quantize_256(row, chunk, n_sub, p.n, lid);
    }
}
