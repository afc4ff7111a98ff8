//! The AVX2 + FMA + F16C forms of the attention kernels: the same operations per lane as the
//! portable loops in `mod.rs`.

use super::Keys;
use crate::quant::avx2::load_f16x8;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores<const G: usize, const N: usize>(
    qs: [&[f32]; G],
    ks: [&[u16]; N],
) -> [[f32; N]; G] {
    let n = qs[0].len();
    let mut acc = [[_mm256_setzero_ps(); N]; G];
    for c in 0..n / 8 {
        let kv: [__m256; N] = std::array::from_fn(|i| load_f16x8(ks[i].as_ptr().add(8 * c)));
        for (g, q) in qs.iter().enumerate() {
            let qv = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            for i in 0..N {
                acc[g][i] = _mm256_fmadd_ps(kv[i], qv, acc[g][i]);
            }
        }
    }
    std::array::from_fn(|g| {
        std::array::from_fn(|key| {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[g][key]);
            let (q, k) = (qs[g], ks[key]);
            for i in 8 * (n / 8)..n {
                lanes[i % 8] += q[i] * super::f16_to_f32(k[i]);
            }
            crate::simd_math::hsum8(&lanes)
        })
    })
}

/// `softmax` with the exp (`simd_math::expf8`, the scalar `expf_ggml`'s operations per lane)
/// and the f16 rounding (F16C, round to nearest even like `half`) 8 scores at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax(p: &mut [f32], first: usize, last: usize) {
    let n = p.len();
    let n8 = n & !7;
    let max = p.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let vmax = _mm256_set1_ps(max);
    for i in (0..n8).step_by(8) {
        let x = _mm256_sub_ps(_mm256_loadu_ps(p.as_ptr().add(i)), vmax);
        _mm256_storeu_ps(p.as_mut_ptr().add(i), crate::simd_math::expf8(x));
    }
    for x in &mut p[n8..] {
        *x = crate::simd_math::expf_ggml(*x - max);
    }
    let scale = (1.0 / super::group_sum(p, first, last)) as f32;
    let vscale = _mm256_set1_ps(scale);
    for i in (0..n8).step_by(8) {
        let x = _mm256_mul_ps(_mm256_loadu_ps(p.as_ptr().add(i)), vscale);
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        _mm256_storeu_ps(p.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
    }
    for x in &mut p[n8..] {
        *x = super::f16::from_f32(*x * scale).to_f32();
    }
}

/// `add_lanes` for keys `a..=b`, lane by lane: for lane l and C chunks of 8 dims the G·C
/// partial sums are loaded into registers, the lane's keys in the range (ascending, the order of
/// the one-head loop) pass, and the sums are stored back; each value chunk is converted once for
/// the G heads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn lanes<const G: usize>(
    ps: [&[f32]; G],
    v: &[u16],
    keys: Keys,
    (a, b): (usize, usize),
    hd: usize,
    lanes: &mut [f32],
) {
    assert!(lanes.len() == G * 8 * hd && v.len() >= keys.at(b) + hd);
    assert!(keys.first <= a && b <= keys.last);
    assert!(ps.iter().all(|p| p.len() == keys.last + 1 - keys.first));
    for l in 0..8 {
        let j0 = a + (l + 8 - a % 8) % 8;
        if j0 > b {
            continue;
        }
        let mut c = 0;
        while c + 2 <= hd / 8 {
            lane_chunks::<G, 2>(ps, v, keys, (j0, b), 8 * c, lanes, l * hd + 8 * c, hd);
            c += 2;
        }
        if c < hd / 8 {
            lane_chunks::<G, 1>(ps, v, keys, (j0, b), 8 * c, lanes, l * hd + 8 * c, hd);
        }
        for d in 8 * (hd / 8)..hd {
            for j in (j0..=b).step_by(8) {
                let x = super::f16_to_f32(v[keys.at(j) + d]);
                for (g, p) in ps.iter().enumerate() {
                    lanes[(g * 8 + l) * hd + d] += p[j - keys.first] * x;
                }
            }
        }
    }
}

/// C chunks of 8 dims from `dim` for the keys `j0, j0+8, ..= b` of one lane; head g's sums
/// are at `lanes[g * 8 * hd + at ..]`, continued from what they hold.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_chunks<const G: usize, const C: usize>(
    ps: [&[f32]; G],
    v: &[u16],
    keys: Keys,
    (j0, b): (usize, usize),
    dim: usize,
    lanes: &mut [f32],
    at: usize,
    hd: usize,
) {
    let sums = |g: usize, c: usize| g * 8 * hd + at + 8 * c;
    let mut acc: [[__m256; C]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|c| _mm256_loadu_ps(lanes.as_ptr().add(sums(g, c))))
    });
    let mut j = j0;
    while j <= b {
        let vp = v.as_ptr().add(keys.at(j) + dim);
        let x: [__m256; C] = std::array::from_fn(|c| load_f16x8(vp.add(8 * c)));
        for (accs, p) in acc.iter_mut().zip(ps) {
            let p = _mm256_set1_ps(*p.get_unchecked(j - keys.first));
            for (a, x) in accs.iter_mut().zip(x) {
                *a = _mm256_fmadd_ps(p, x, *a);
            }
        }
        j += 8;
    }
    for (g, accs) in acc.iter().enumerate() {
        for (c, a) in accs.iter().enumerate() {
            _mm256_storeu_ps(lanes.as_mut_ptr().add(sums(g, c)), *a);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn heads<const G: usize, const N: usize>(
    rows: &mut [super::BlockRow<G>],
    k: &[u16],
    v: &[u16],
) {
    super::heads::<true, G, N>(rows, k, v)
}
