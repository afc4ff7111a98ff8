//! The delta rule's two per-row steps for `R` state rows at once on AVX-512: the same operations
//! per lane as `avx2::decay_dot` / `avx2::update_dot` (so the same bits), with ggml's four 8-lane
//! accumulators of a row held as two 16-lane registers (lanes 0-15 and 16-31). One row's steps form
//! a chain of dependent operations (dot, reduce, delta, update, dot); interleaving `R` rows keeps
//! the FMA units busy, and each `k` / `q` chunk is loaded once for the `R` rows.

use super::sums::ordered_sum;
use std::arch::x86_64::*;

/// `GGML_F32x8_REDUCE` of the accumulators `[v0|v1]`, `[v2|v3]`: (v0+v2) + (v1+v3), the 128-bit
/// halves, two horizontal adds, as `avx2::reduce`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn reduce(lo: __m512, hi: __m512) -> f32 {
    let s = _mm512_add_ps(lo, hi);
    let x = _mm256_add_ps(
        _mm512_castps512_ps256(s),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s))),
    );
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// For rows `r < R` at `dst + r·n` (read from `src + r·n`, which may be `dst`): `row = src_row · e`,
/// then `dot(row, k)` in ggml's order.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn decay_dot_rows<const R: usize>(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    e: f32,
    k: &[f32],
) -> [f32; R] {
    let np = n & !31;
    let kp = k.as_ptr();
    let ve = _mm512_set1_ps(e);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for i in (0..np).step_by(32) {
        let kv = [_mm512_loadu_ps(kp.add(i)), _mm512_loadu_ps(kp.add(i + 16))];
        for (r, a) in acc.iter_mut().enumerate() {
            for (h, (a, kv)) in a.iter_mut().zip(kv).enumerate() {
                let at = r * n + i + 16 * h;
                let s = _mm512_mul_ps(_mm512_loadu_ps(src.add(at)), ve);
                _mm512_storeu_ps(dst.add(at), s);
                *a = _mm512_fmadd_ps(s, kv, *a);
            }
        }
    }
    std::array::from_fn(|r| {
        let row = dst.add(r * n);
        for i in np..n {
            *row.add(i) = *src.add(r * n + i) * e;
        }
        let tail = std::slice::from_raw_parts(row.add(np), n - np);
        ordered_sum(reduce(acc[r][0], acc[r][1]), tail, &k[np..n])
    })
}

/// For rows `r < R` at `rows + r·n`: `row += k·d[r]` (fused), then `dot(row, q)` in ggml's order.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn update_dot_rows<const R: usize>(
    rows: *mut f32,
    n: usize,
    k: &[f32],
    d: [f32; R],
    q: &[f32],
) -> [f32; R] {
    let np = n & !31;
    let (kp, qp) = (k.as_ptr(), q.as_ptr());
    let vd: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(d[r]));
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for i in (0..np).step_by(32) {
        let kv = [_mm512_loadu_ps(kp.add(i)), _mm512_loadu_ps(kp.add(i + 16))];
        let qv = [_mm512_loadu_ps(qp.add(i)), _mm512_loadu_ps(qp.add(i + 16))];
        for (r, a) in acc.iter_mut().enumerate() {
            for h in 0..2 {
                let p = rows.add(r * n + i + 16 * h);
                let s = _mm512_fmadd_ps(kv[h], vd[r], _mm512_loadu_ps(p));
                _mm512_storeu_ps(p, s);
                a[h] = _mm512_fmadd_ps(s, qv[h], a[h]);
            }
        }
    }
    std::array::from_fn(|r| {
        let row = std::slice::from_raw_parts_mut(rows.add(r * n), n);
        for (s, &kv) in row[np..].iter_mut().zip(&k[np..]) {
            *s = kv.mul_add(d[r], *s);
        }
        ordered_sum(reduce(acc[r][0], acc[r][1]), &row[np..], &q[np..])
    })
}
