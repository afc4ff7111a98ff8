//! The recurrent kernels' AVX2 + FMA row steps: the same operations per element as the scalar
//! forms in `delta` and `mamba2` (so the same bits), ggml's four 8-lane accumulators per row.

use super::sums::ordered_sum;
use std::arch::x86_64::*;

/// `GGML_F32x8_REDUCE`: (v0+v2) + (v1+v3), low + high 128 bits, two horizontal adds.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce(acc: [__m256; 4]) -> f32 {
    let x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// `dst = src · e` (`n` elements; `src` may be `dst`), then `dot(dst, k)` in ggml's order.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn decay_dot(src: *const f32, dst: *mut f32, n: usize, e: f32, k: &[f32]) -> f32 {
    let np = n & !31;
    let kp = k.as_ptr();
    let ve = _mm256_set1_ps(e);
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            let s = _mm256_mul_ps(_mm256_loadu_ps(src.add(i + 8 * j)), ve);
            _mm256_storeu_ps(dst.add(i + 8 * j), s);
            *a = _mm256_fmadd_ps(s, _mm256_loadu_ps(kp.add(i + 8 * j)), *a);
        }
    }
    for i in np..n {
        *dst.add(i) = *src.add(i) * e;
    }
    let tail = std::slice::from_raw_parts(dst.add(np), n - np);
    ordered_sum(reduce(acc), tail, &k[np..n])
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn update_dot(row: &mut [f32], k: &[f32], d: f32, q: &[f32]) -> f32 {
    let n = row.len();
    let np = n & !31;
    let (rp, kp, qp) = (row.as_mut_ptr(), k.as_ptr(), q.as_ptr());
    let vd = _mm256_set1_ps(d);
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            let p = rp.add(i + 8 * j);
            let s = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(i + 8 * j)), vd, _mm256_loadu_ps(p));
            _mm256_storeu_ps(p, s);
            *a = _mm256_fmadd_ps(s, _mm256_loadu_ps(qp.add(i + 8 * j)), *a);
        }
    }
    for (s, &kv) in row[np..].iter_mut().zip(&k[np..]) {
        *s = kv.mul_add(d, *s);
    }
    ordered_sum(reduce(acc), &row[np..], &q[np..])
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scan_row(row: &mut [f32], da: f32, b: &[f32], x_dt: f32, c: &[f32]) -> f32 {
    let n = row.len();
    let np = n & !31;
    let (rp, bp, cp) = (row.as_mut_ptr(), b.as_ptr(), c.as_ptr());
    let (vda, vxdt) = (_mm256_set1_ps(da), _mm256_set1_ps(x_dt));
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            let p = rp.add(i + 8 * j);
            let s = _mm256_fmadd_ps(
                _mm256_loadu_ps(p),
                vda,
                _mm256_mul_ps(_mm256_loadu_ps(bp.add(i + 8 * j)), vxdt),
            );
            _mm256_storeu_ps(p, s);
            *a = _mm256_fmadd_ps(s, _mm256_loadu_ps(cp.add(i + 8 * j)), *a);
        }
    }
    let mut sum = reduce(acc);
    for i in np..n {
        let s = row[i].mul_add(da, b[i] * x_dt);
        row[i] = s;
        sum = s.mul_add(c[i], sum);
    }
    sum
}
