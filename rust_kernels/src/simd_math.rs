//! The float steps several kernels share, in ggml's operation order: the 8-lane horizontal sum
//! and ggml's vectorised exp (scalar, lane by lane, and as AVX2 intrinsics with the same
//! operations per lane, so the same bits). A leaf: it imports nothing of the crate.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The 8-lane horizontal sum used by ggml/tinyBLAS on x86 (llama.cpp's `hsum_float_8`): halves
/// added lane-wise, then lanes {0,2} and {1,3}, then the two: ((x0+x4)+(x2+x6)) + ((x1+x5)+(x3+x7)).
#[inline(always)]
pub fn hsum8(x: &[f32; 8]) -> f32 {
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// ggml's AVX2 `ggml_v_expf` evaluated lane by lane (same constants, same fused operations).
#[inline(always)]
pub fn expf_ggml(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `bits` as an f32 in all 8 lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn c(bits: u32) -> __m256 {
    _mm256_set1_ps(f32::from_bits(bits))
}

/// `expf_ggml` per lane.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn expf8(x: __m256) -> __m256 {
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let neg_n = _mm256_xor_ps(n, _mm256_set1_ps(-0.0));
    let b = _mm256_fmadd_ps(
        neg_n,
        c(0x35bf_be8e),
        _mm256_fmadd_ps(neg_n, c(0x3f31_7200), x),
    );
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f80_0000)));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_mul_ps(c(0x3f7f_fff6), b),
    );
    let fast = _mm256_fmadd_ps(j, k, k);
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let is_fast = _mm256_cmp_ps::<_CMP_LE_OQ>(abs_n, _mm256_set1_ps(126.0));
    if _mm256_movemask_ps(is_fast) == 0xff {
        return fast;
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    let slow = _mm256_blendv_ps(
        _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
        _mm256_mul_ps(s1, s1),
        big,
    );
    _mm256_blendv_ps(slow, fast, is_fast)
}

#[cfg(test)]
mod tests {
    use super::expf_ggml;

    #[test]
    fn exp_matches_libm_closely() {
        for i in -2000..=0 {
            let x = i as f32 * 0.05;
            let (got, want) = (expf_ggml(x), x.exp());
            assert!(
                (got - want).abs() <= want * 4e-7 + 1e-38,
                "exp({x}) = {got}, libm {want}"
            );
        }
    }
}
