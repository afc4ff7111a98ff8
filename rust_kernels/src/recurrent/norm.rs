//! The L2 norms of the recurrent layers' q and k: `ggml_l2_norm`, and the RMSNorm-based form
//! current llama.cpp's Gated DeltaNet graphs use.

/// `out = x / max(sqrt(Σx²), eps)` per row of `n` (`ggml_l2_norm`): squares in f32 summed in f64,
/// the sum rounded to f32 before `sqrtf`, then one multiply by the f32 reciprocal.
pub fn l2_norm(x: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum = row.iter().fold(0.0f64, |s, &v| s + (v * v) as f64);
        let scale = 1.0 / (sum as f32).sqrt().max(eps);
        for (y, &v) in o.iter_mut().zip(row) {
            *y = v * scale;
        }
    }
}

/// q/k normalisation of current llama.cpp's Gated DeltaNet graphs (`build_gdn_l2_norm` in
/// src/models/models.h): `ggml_scale(ggml_rms_norm(x, eps / n), 1 / sqrtf(n))` per row of `n`, i.e.
/// `x / sqrt(Σx² + eps)` with RMSNorm's rounding (`ops::rms_norm`) and one more multiply.
/// (The model reference §3.4 describes the older `ggml_l2_norm` form, `l2_norm` here.)
/// Rows are split across the current rayon pool (the rule runs inside `threads::run`).
pub fn gdn_l2_norm(x: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    let nf = n as f32;
    let s = 1.0 / nf.sqrt();
    crate::threads::par_rows(out, n, |r0, o| {
        crate::ops::rms_norm(&x[r0 * n..r0 * n + o.len()], n, None, eps / nf, o);
        for y in o.iter_mut() {
            *y *= s;
        }
    });
}
