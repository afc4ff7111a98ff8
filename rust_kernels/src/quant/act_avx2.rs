//! AVX2 activation quantizers (Q8_0, Q8_K), bit-identical to the scalar ones in `act.rs` for finite
//! input; `act.rs` picks them when the CPU has AVX2.

use super::blocks::{BlockQ8K, BlockQ8_0};
use std::arch::x86_64::*;

/// Four vectors of 8 integral floats (|v| <= 127 after the `min`) packed into 32 i8 in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_i8x32(v: [__m256; 4]) -> __m256i {
    let cap = _mm256_set1_epi32(127);
    let i: [__m256i; 4] = std::array::from_fn(|k| _mm256_min_epi32(_mm256_cvtps_epi32(v[k]), cap));
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Round to nearest, ties to even (the default MXCSR mode, as `round_ties_even`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_even(v: __m256) -> __m256 {
    _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
}

/// Largest |x| over `x` (a multiple of 8 long) and whether any element is NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn abs_max_nan(x: &[f32]) -> (f32, bool) {
    let sign = _mm256_set1_ps(-0.0);
    let (mut m, mut nan) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for c in x.chunks_exact(8) {
        let v = _mm256_loadu_ps(c.as_ptr());
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_max_ss(h, _mm_movehdup_ps(h));
    (_mm_cvtss_f32(h), _mm256_movemask_ps(nan) != 0)
}

/// `quantize_q8_0` for 32 finite floats (`None` when a value is not finite: the caller then runs
/// the scalar quantizer, whose NaN/infinity conversions differ from the vector ones).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x.len() == 32`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_0(x: &[f32]) -> Option<BlockQ8_0> {
    assert_eq!(x.len(), 32);
    let (amax, nan) = abs_max_nan(x);
    if nan || !amax.is_finite() || amax == 0.0 {
        return None;
    }
    let id = _mm256_set1_ps(127.0 / amax);
    let v: [__m256; 4] = std::array::from_fn(|k| {
        round_even(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * k)), id))
    });
    let mut b = BlockQ8_0 {
        d: half::f16::from_f32(amax / 127.0).to_f32(),
        qs: [0; 32],
    };
    _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, pack_i8x32(v));
    Some(b)
}

/// `quantize_q8k` for 256 finite floats (`None` otherwise, as `quantize_q8_0`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x.len() == 256`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8k(x: &[f32]) -> Option<BlockQ8K> {
    assert_eq!(x.len(), 256);
    let (amax, nan) = abs_max_nan(x);
    if nan || !amax.is_finite() || amax == 0.0 {
        return None;
    }
    // The first element whose |x| is the maximum, as the scalar scan keeps it.
    let sign = _mm256_set1_ps(-0.0);
    let target = _mm256_set1_ps(amax);
    let mut max = amax;
    for (c, chunk) in x.chunks_exact(8).enumerate() {
        let v = _mm256_loadu_ps(chunk.as_ptr());
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            _mm256_andnot_ps(sign, v),
            target,
        ));
        if hit != 0 {
            max = x[8 * c + hit.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0 / max;
    let vs = _mm256_set1_ps(iscale);
    let mut b = BlockQ8K {
        d: 1.0 / iscale,
        qs: [0; 256],
        bsums: [0; 16],
        psums: [0; 8],
    };
    for g in 0..8 {
        let v: [__m256; 4] = std::array::from_fn(|k| {
            round_even(_mm256_mul_ps(
                vs,
                _mm256_loadu_ps(x.as_ptr().add(32 * g + 8 * k)),
            ))
        });
        _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * g) as *mut __m256i, pack_i8x32(v));
    }
    for (k, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i16).sum();
    }
    b.psums = std::array::from_fn(|k| b.bsums[2 * k] + b.bsums[2 * k + 1]);
    Some(b)
}
