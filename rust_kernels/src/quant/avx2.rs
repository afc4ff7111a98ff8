//! AVX2 + FMA + F16C dot products for every weight type.
//!
//! Integer parts are exact (maddubs/madd as llama.cpp's x86 kernels do); each block adds one FMA
//! into an 8-lane float accumulator in block order, reduced once at the end. The order depends
//! only on the row length, never on the batch.

use super::act::RowSlices;
use super::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use super::{Activations, GgmlType};
use std::arch::x86_64::*;

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot(t: GgmlType, w: &[u8], acts: &Activations, r: usize) -> f32 {
    vec_dot_act_rows::<1>(t, w, &acts.rows::<1>(r).rows)[0]
}

/// One weight row against activation rows already resolved to slices (`Activations::rows`),
/// bit-identical to R calls of `vec_dot`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_act_rows<const R: usize>(
    t: GgmlType,
    w: &[u8],
    ys: &RowSlices<R>,
) -> [f32; R] {
    match (t, ys) {
        (GgmlType::F32, RowSlices::F32(a)) => a.map(|a| dot_f32(w, a)),
        (GgmlType::F16, RowSlices::F16(a)) => a.map(|a| dot_f16(w, a)),
        (GgmlType::BF16, RowSlices::BF16(a)) => a.map(|a| dot_bf16(w, a)),
        (GgmlType::Q8_0, RowSlices::Q8_0(ys)) if R == 1 => dot_q8_0::<R>(w, *ys),
        (GgmlType::Q8_0, RowSlices::Q8_0(ys)) => dot_q8_0_rows::<R>(w, *ys),
        (GgmlType::Q4_0, RowSlices::Q8_0(ys)) => dot_q4_0::<R>(w, *ys),
        (GgmlType::Q5_0, RowSlices::Q8_0(ys)) => dot_q5_0::<R>(w, *ys),
        (GgmlType::Q4_1, RowSlices::Q8_1(ys)) => dot_q4_1::<R>(w, *ys),
        (GgmlType::Q5_1, RowSlices::Q8_1(ys)) => dot_q5_1::<R>(w, *ys),
        (GgmlType::Q4K, RowSlices::Q8K(ys)) => dot_q45k_rows::<false, R>(w, *ys),
        (GgmlType::Q5K, RowSlices::Q8K(ys)) => dot_q45k_rows::<true, R>(w, *ys),
        (GgmlType::Q6K, RowSlices::Q8K(ys)) => dot_q6k_rows::<R>(w, *ys),
        _ => panic!("activation format does not match weight type {t:?}"),
    }
}

/// One little-endian f16 at `b[off..off+2]` converted with F16C (half's converter is not inlined
/// here and a call per block costs more than the block's arithmetic). The conversion is inline asm
/// because LLVM narrows `_mm_cvtph_ps` of one lane to a `vpinsrw` into whatever register it likes,
/// often the float accumulator: that chained every block's scale to the previous block's FMA and
/// made Q8_0/Q5_0 rows latency-bound (~40% slower streams).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_at(b: &[u8], off: usize) -> f32 {
    debug_assert!(off + 2 <= b.len());
    let bits = std::ptr::read_unaligned(b.as_ptr().add(off) as *const u16);
    let v = _mm_cvtsi32_si128(bits as i32);
    let r: __m128;
    std::arch::asm!(
        "vcvtph2ps {r}, {v}",
        r = lateout(xmm_reg) r,
        v = in(xmm_reg) v,
        options(pure, nomem, nostack, preserves_flags)
    );
    _mm_cvtss_f32(r)
}

/// `v` unchanged, hidden from the optimizer: LLVM folds a product of two broadcasts back into a
/// scalar multiply plus a broadcast shuffle per row (one more vector uop than a broadcast load).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn opaque(mut v: __m256) -> __m256 {
    std::arch::asm!("/* {v} */", v = inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles first (elements 0..15), then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let v = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// Byte `i` = 0xFF if bit `i` of `x` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits32(x: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(x as i32),
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    // Every bit but bit (i % 8) set in byte i: OR gives all-ones exactly when that bit is set.
    let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}

/// Sum of products of 32 unsigned bytes (< 128) with 32 signed bytes, as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// The four 32-quant groups of a Q6_K half-block as unsigned 6-bit values: low nibbles from `a`
/// and `c` (32 bytes each), the high 2-bit planes from `h`; `m4` = 0x0f bytes, `m3` = 0x03 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_quads(a: __m256i, c: __m256i, h: __m256i, m4: __m256i, m3: __m256i) -> [__m256i; 4] {
    [
        _mm256_or_si256(
            _mm256_and_si256(a, m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(h, m3)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(c, m4),
            _mm256_slli_epi16::<2>(_mm256_and_si256(h, _mm256_slli_epi16::<2>(m3))),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
            _mm256_and_si256(h, _mm256_slli_epi16::<4>(m3)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4),
            _mm256_srli_epi16::<2>(_mm256_and_si256(h, _mm256_slli_epi16::<6>(m3))),
        ),
    ]
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn read_u32(p: *const u8) -> u32 {
    u32::from_le_bytes(std::ptr::read_unaligned(p as *const [u8; 4]))
}

macro_rules! dot_vs_q8_0 {
    ($name:ident, $bytes:expr, |$b:ident| $load:expr) => {
        /// One weight row against R activation rows; each output keeps the one-row operation order.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const R: usize>(w: &[u8], ys: [&[BlockQ8_0]; R]) -> [f32; R] {
            let nb = ys[0].len();
            assert!(w.len() >= nb * $bytes && ys.iter().all(|y| y.len() == nb));
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let $b = w.as_ptr().add(i * $bytes);
                let dw = f16_at(w, i * $bytes);
                let qx: __m256i = $load;
                let ax = _mm256_sign_epi8(qx, qx);
                // dw * yd as a vector product of two broadcasts (the same IEEE product): the
                // row's scale then costs a broadcast load and one multiply, no shuffle.
                let bdw = opaque(_mm256_set1_ps(dw));
                for r in 0..R {
                    let yb = ys[r].get_unchecked(i);
                    let sy = _mm256_sign_epi8(load(yb.qs.as_ptr() as *const u8), qx);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
                    let d = _mm256_mul_ps(bdw, _mm256_broadcast_ss(&yb.d));
                    acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
                }
            }
            // Plain loops: a closure here (not always inlined) took `acc` by reference, which
            // kept the accumulators in memory with a store per row and block.
            let mut out = [0.0f32; R];
            for r in 0..R {
                out[r] = hsum_ps(acc[r]);
            }
            out
        }
    };
}

dot_vs_q8_0!(dot_q8_0, 34, |b| load(b.add(2)));
dot_vs_q8_0!(dot_q4_0, 18, |b| _mm256_sub_epi8(
    nibbles32(b.add(2)),
    _mm256_set1_epi8(8)
));
// 5th bit clear -> set the top nibble, so the byte reads as (q - 16) in two's complement.
dot_vs_q8_0!(dot_q5_0, 22, |b| _mm256_or_si256(
    nibbles32(b.add(6)),
    _mm256_andnot_si256(bits32(read_u32(b.add(2))), _mm256_set1_epi8(0xF0u8 as i8))
));

/// `dot_q8_0` for R > 1 activation rows as a function of its own: inlined into
/// `vec_dot_act_rows`' large match, LLVM kept the R accumulators on the stack (a store per row and
/// block, ~25% of a row's cost).
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_rows<const R: usize>(w: &[u8], ys: [&[BlockQ8_0]; R]) -> [f32; R] {
    dot_q8_0::<R>(w, ys)
}

macro_rules! dot_vs_q8_1 {
    ($name:ident, $bytes:expr, |$b:ident| $load:expr) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const R: usize>(w: &[u8], ys: [&[BlockQ8_1]; R]) -> [f32; R] {
            let nb = ys[0].len();
            assert!(w.len() >= nb * $bytes && ys.iter().all(|y| y.len() == nb));
            let mut acc = [_mm256_setzero_ps(); R];
            let mut mins = [0.0f32; R];
            for i in 0..nb {
                let $b = w.as_ptr().add(i * $bytes);
                let (dw, mw) = (f16_at(w, i * $bytes), f16_at(w, i * $bytes + 2));
                let qx: __m256i = $load;
                for r in 0..R {
                    let yb = ys[r].get_unchecked(i);
                    mins[r] += mw * yb.s;
                    let p = dot_u8_i8(qx, load(yb.qs.as_ptr() as *const u8));
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_set1_ps(dw * yb.d), _mm256_cvtepi32_ps(p), acc[r]);
                }
            }
            std::array::from_fn(|r| hsum_ps(acc[r]) + mins[r])
        }
    };
}

dot_vs_q8_1!(dot_q4_1, 20, |b| nibbles32(b.add(4)));
dot_vs_q8_1!(dot_q5_1, 24, |b| _mm256_or_si256(
    nibbles32(b.add(8)),
    _mm256_and_si256(bits32(read_u32(b.add(4))), _mm256_set1_epi8(0x10))
));

/// The 8 six-bit scales (low 128 bits) and 8 six-bit mins (high 128 bits) of a Q4_K/Q5_K block as
/// i16 lanes, from the 12 packed bytes at `p` (llama.cpp's `utmp` shuffle; same values as
/// `kquants::scales_mins`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45k_scales_mins(p: *const u8) -> __m256i {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let (u0, u1, u2) = (read_u32(p), read_u32(p.add(4)), read_u32(p.add(8)));
    let sc_lo = u0 & K1;
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m_lo = u1 & K1;
    let m_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    _mm256_cvtepu8_epi16(_mm_set_epi32(
        m_hi as i32,
        m_lo as i32,
        sc_hi as i32,
        sc_lo as i32,
    ))
}

/// Shuffle mask that broadcasts i16 lane `k` (0..8) of a 128-bit half to all its lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast16_mask(k: usize) -> __m256i {
    let lo = (2 * k) as i16;
    _mm256_set1_epi16(lo | ((lo + 1) << 8))
}

/// Bit `b` (0..8) of every byte of `qh`, moved to bit 4 (the 5th bit of a Q5_K quant).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit_to_4(qh: __m256i, b: usize) -> __m256i {
    let m = _mm256_and_si256(qh, _mm256_set1_epi8((1u8 << b) as i8));
    match b {
        0 => _mm256_slli_epi16::<4>(m),
        1 => _mm256_slli_epi16::<3>(m),
        2 => _mm256_slli_epi16::<2>(m),
        3 => _mm256_slli_epi16::<1>(m),
        4 => m,
        5 => _mm256_srli_epi16::<1>(m),
        6 => _mm256_srli_epi16::<2>(m),
        _ => _mm256_srli_epi16::<3>(m),
    }
}

/// Q4_K and Q5_K, one weight row against R activation rows (R = 1 for one row alone). They share
/// everything but the 5th bit (`HIGH`) and how llama.cpp accumulates the mins term (kept identical
/// here): Q4_K in 4 float lanes, Q5_K in one fused scalar sum. Every output keeps llama.cpp's
/// one-row operation order (the integer lane sums are exact, so sharing loads across rows changes
/// no bit). Each row's scale products (`dw * yd`, `-yd * dminw`) are vector products of two
/// broadcasts (the same IEEE products as the scalar ones, without a scalar-to-vector move per
/// row), the mins use the activations' precomputed sub-block sums (`psums`, equal to llama.cpp's
/// `hadd` of `bsums`), and the accumulators never leave the function (no spill per block for a
/// closure to read).
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q45k_rows<const HIGH: bool, const R: usize>(
    w: &[u8],
    ys: [&[BlockQ8K]; R],
) -> [f32; R] {
    let bytes = if HIGH { 176 } else { 144 };
    let qs_at = if HIGH { 48 } else { 16 };
    let nb = ys[0].len();
    assert!(w.len() >= nb * bytes && ys.iter().all(|y| y.len() == nb));
    let m4 = _mm256_set1_epi8(0x0F);
    let sign = _mm_set1_ps(-0.0);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins4 = [_mm_setzero_ps(); R];
    let mut mins1 = [0.0f32; R];
    // The mins term first, in a pass of its own: interleaved with the quants below, its R
    // accumulators and the R float accumulators did not fit in registers beside the integer sums.
    for i in 0..nb {
        let sm = q45k_scales_mins(w.as_ptr().add(i * bytes + 4));
        let mins8 = _mm256_extracti128_si256::<1>(sm);
        let dminw = _mm_set1_ps(f16_at(w, i * bytes + 2));
        for r in 0..R {
            let yb = ys[r].get_unchecked(i);
            let prod = _mm_madd_epi16(mins8, _mm_loadu_si128(yb.psums.as_ptr() as *const __m128i));
            let neg_dmin = _mm_mul_ps(_mm_xor_ps(_mm_broadcast_ss(&yb.d), sign), dminw);
            if HIGH {
                let total = _mm_hadd_epi32(_mm_hadd_epi32(prod, prod), prod);
                mins1[r] =
                    _mm_cvtss_f32(neg_dmin).mul_add(_mm_cvtsi128_si32(total) as f32, mins1[r]);
            } else {
                mins4[r] = _mm_fmadd_ps(neg_dmin, _mm_cvtepi32_ps(prod), mins4[r]);
            }
        }
    }
    for i in 0..nb {
        let bp = w.as_ptr().add(i * bytes);
        let sm = q45k_scales_mins(bp.add(4));
        let scales = _mm256_permute2x128_si256::<0x00>(sm, sm);
        let qh = if HIGH {
            load(bp.add(16))
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); R];
        for c in 0..4 {
            let raw = load(bp.add(qs_at + 32 * c));
            let mut lo = _mm256_and_si256(raw, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
            if HIGH {
                lo = _mm256_or_si256(lo, bit_to_4(qh, 2 * c));
                hi = _mm256_or_si256(hi, bit_to_4(qh, 2 * c + 1));
            }
            let s_lo = _mm256_shuffle_epi8(scales, bcast16_mask(2 * c));
            let s_hi = _mm256_shuffle_epi8(scales, bcast16_mask(2 * c + 1));
            for r in 0..R {
                let y = (ys[r].get_unchecked(i).qs.as_ptr() as *const u8).add(64 * c);
                let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(y)), s_lo);
                let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(y.add(32))), s_hi);
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(plo, phi));
            }
        }
        let dw = opaque(_mm256_set1_ps(f16_at(w, i * bytes)));
        for r in 0..R {
            let d = _mm256_mul_ps(dw, _mm256_broadcast_ss(&ys[r].get_unchecked(i).d));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let mut m = [0.0f32; 4];
        _mm_storeu_ps(m.as_mut_ptr(), mins4[r]);
        out[r] = hsum_ps(acc[r])
            + if HIGH {
                mins1[r]
            } else {
                (m[0] + m[2]) + (m[1] + m[3])
            };
    }
    out
}

/// Q6_K, one weight row against R activation rows (R = 1 for one row alone): llama.cpp's one-row
/// operations per output, with each row's scale product as a vector product of two broadcasts and
/// the accumulators kept in the function (see `dot_q45k_rows`).
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6k_rows<const R: usize>(w: &[u8], ys: [&[BlockQ8K]; R]) -> [f32; R] {
    let nb = ys[0].len();
    assert!(w.len() >= nb * 210 && ys.iter().all(|y| y.len() == nb));
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let bp = w.as_ptr().add(i * 210);
        let sc8 = _mm_loadu_si128(bp.add(192) as *const __m128i);
        // The -32 offset through the Q8_K block sums, per lane as llama.cpp subtracts it:
        // lane k starts at -32 * (scale[2k] * bsum[2k] + scale[2k+1] * bsum[2k+1]).
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let mut sumi: [__m256i; R] = std::array::from_fn(|r| {
            let bs = load(ys[r].get_unchecked(i).bsums.as_ptr() as *const u8);
            _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs)),
            )
        });
        for n in 0..2 {
            let a = load(bp.add(64 * n));
            let c = load(bp.add(64 * n + 32));
            let h = load(bp.add(128 + 32 * n));
            let quads = q6k_quads(a, c, h, m4, m3);
            for (j, q) in quads.iter().enumerate() {
                let k = 8 * n + 2 * j;
                let sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                    sc8,
                    _mm_set_epi64x(
                        (0x0101_0101_0101_0101u64 * (k as u64 + 1)) as i64,
                        (0x0101_0101_0101_0101u64 * k as u64) as i64,
                    ),
                ));
                for r in 0..R {
                    let y = (ys[r].get_unchecked(i).qs.as_ptr() as *const u8).add(128 * n + 32 * j);
                    let p = _mm256_maddubs_epi16(*q, load(y));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sv));
                }
            }
        }
        let dw = opaque(_mm256_set1_ps(f16_at(w, i * 210 + 208)));
        for r in 0..R {
            let d = _mm256_mul_ps(dw, _mm256_broadcast_ss(&ys[r].get_unchecked(i).d));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
    out
}

/// ggml's `GGML_F32x8_REDUCE` of four 8-lane accumulators: (a0+a2) + (a1+a3), then the two
/// 128-bit halves, then two `hadd`s: ((l0+l1) + (l2+l3)) with l = low + high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reduce_f32x8x4(acc: [__m256; 4]) -> f32 {
    let x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// Four 8-lane FMA accumulators over the 32-element steps of `ggml_vec_dot_f32`/`_f16` (AVX2),
/// reduced as ggml does; returns the sum and where the tail starts.
macro_rules! dot_float_body {
    ($wt:ty, $at:ty, $w:ident, $a:ident, |$p:ident| $load_w:expr, |$q:ident| $load_a:expr) => {{
        let n = $a.len();
        let wp = $w.as_ptr() as *const $wt;
        let mut acc = [_mm256_setzero_ps(); 4];
        let steps = n / 32;
        for s in 0..steps {
            for (k, accum) in acc.iter_mut().enumerate() {
                let off = 32 * s + 8 * k;
                let $p = wp.add(off);
                let $q = $a.as_ptr().add(off);
                *accum = _mm256_fmadd_ps($load_w, $load_a, *accum);
            }
        }
        (reduce_f32x8x4(acc), 32 * steps, wp)
    }};
}

/// F32 rows as ggml's `ggml_vec_dot_f32` (AVX2): the reduced sum is a float, and GCC compiles
/// its tail loop (`sumf += x[i]*y[i]`) as groups of four rounded products added in order, then
/// fused multiply-adds for the last `n % 4` elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], a: &[f32]) -> f32 {
    let n = a.len();
    let (mut sum, tail, wp) =
        dot_float_body!(f32, f32, w, a, |p| _mm256_loadu_ps(p), |q| _mm256_loadu_ps(
            q
        ));
    let fused = tail + (n - tail) / 4 * 4;
    for (i, &av) in a.iter().enumerate().take(fused).skip(tail) {
        sum += std::ptr::read_unaligned(wp.add(i)) * av;
    }
    for (i, &av) in a.iter().enumerate().skip(fused) {
        sum = std::ptr::read_unaligned(wp.add(i)).mul_add(av, sum);
    }
    sum
}

/// F16 rows as ggml's `ggml_vec_dot_f16` (AVX2): the reduced sum and the tail's products
/// (exact in f32) accumulated in f64 (ggml_float).
macro_rules! dot_float {
    ($name:ident, $wt:ty, $at:ty, |$p:ident| $load_w:expr, |$q:ident| $load_a:expr, $scalar_w:expr, $scalar_a:expr) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(w: &[u8], a: &[$at]) -> f32 {
            let (reduced, tail, wp) = dot_float_body!($wt, $at, w, a, |$p| $load_w, |$q| $load_a);
            let mut sum = reduced as f64;
            for i in tail..a.len() {
                let wv: $wt = std::ptr::read_unaligned(wp.add(i));
                sum += ($scalar_w(wv) * $scalar_a(a[i])) as f64;
            }
            sum as f32
        }
    };
}

/// BF16 rows as ggml's `ggml_vec_dot_bf16` (AVX2): four 8-lane accumulators over 32-element
/// steps (its `add(mul(x, y), c)`, which GCC contracts to an FMA), (c1+c3) + (c2+c4), `hsum_ps`,
/// the tail's f32 products added in f64.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], a: &[u16]) -> f32 {
    let n = a.len();
    let wp = w.as_ptr() as *const u16;
    let mut acc = [_mm256_setzero_ps(); 4];
    let steps = n / 32;
    for s in 0..steps {
        for (k, accum) in acc.iter_mut().enumerate() {
            let off = 32 * s + 8 * k;
            *accum = _mm256_fmadd_ps(
                load_bf16x8(wp.add(off)),
                load_bf16x8(a.as_ptr().add(off)),
                *accum,
            );
        }
    }
    let c = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let mut sum = hsum_ps(c) as f64;
    for (i, &av) in a.iter().enumerate().skip(32 * steps) {
        let wv: u16 = std::ptr::read_unaligned(wp.add(i));
        sum += (bf16_bits_to_f32(wv) * bf16_bits_to_f32(av)) as f64;
    }
    sum as f32
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16x8(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bf16x8(p: *const u16) -> __m256 {
    let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
}

fn f16_bits_to_f32(v: u16) -> f32 {
    half::f16::from_bits(v).to_f32()
}

fn bf16_bits_to_f32(v: u16) -> f32 {
    half::bf16::from_bits(v).to_f32()
}

dot_float!(
    dot_f16,
    u16,
    u16,
    |p| load_f16x8(p),
    |q| load_f16x8(q),
    f16_bits_to_f32,
    f16_bits_to_f32
);
