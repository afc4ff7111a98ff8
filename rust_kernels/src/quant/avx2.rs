//! AVX2 + FMA + F16C dot products for every weight type.
//!
//! Integer parts are exact (maddubs/madd as llama.cpp's x86 kernels do); each block adds one FMA
//! into an 8-lane float accumulator in block order, reduced once at the end. The order depends
//! only on the row length, never on the batch.

use super::act::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use super::kquants::scales_mins;
use super::{Activations, GgmlType};
use std::arch::x86_64::*;

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot(t: GgmlType, w: &[u8], acts: &Activations, r: usize) -> f32 {
    vec_dot_rows::<1>(t, w, acts, r)[0]
}

/// One weight row against activation rows `r0 .. r0+R`. Each weight block is unpacked once and
/// used for all R rows; every output sees exactly the operations of the one-row case, so the
/// results are bit-identical to `vec_dot` (batch invariance).
///
/// Four weight rows against one activation row, for the Q8_0-activation types (`None` for others):
/// independent accumulators keep more loads in flight in matrix-vector products.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_4rows(
    t: GgmlType,
    ws: [&[u8]; 4],
    acts: &Activations,
    r: usize,
) -> Option<[f32; 4]> {
    let y = [match acts {
        Activations::Q8_0 { .. } => acts.q8_0_row(r),
        _ => return None,
    }];
    let out = match t {
        GgmlType::Q8_0 => dot_q8_0::<4, 1>(ws, y),
        GgmlType::Q4_0 => dot_q4_0::<4, 1>(ws, y),
        GgmlType::Q5_0 => dot_q5_0::<4, 1>(ws, y),
        _ => return None,
    };
    Some(out.map(|o| o[0]))
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_rows<const R: usize>(
    t: GgmlType,
    w: &[u8],
    acts: &Activations,
    r0: usize,
) -> [f32; R] {
    match (t, acts) {
        (GgmlType::F32, Activations::F32 { data, n }) => {
            std::array::from_fn(|i| dot_f32(w, &data[(r0 + i) * n..(r0 + i + 1) * n]))
        }
        (GgmlType::F16, Activations::F16 { data, n }) => {
            std::array::from_fn(|i| dot_f16(w, &data[(r0 + i) * n..(r0 + i + 1) * n]))
        }
        (GgmlType::BF16, Activations::BF16 { data, n }) => {
            std::array::from_fn(|i| dot_bf16(w, &data[(r0 + i) * n..(r0 + i + 1) * n]))
        }
        (GgmlType::Q8_0, Activations::Q8_0 { .. }) => {
            dot_q8_0::<1, R>([w], std::array::from_fn(|i| acts.q8_0_row(r0 + i)))[0]
        }
        (GgmlType::Q4_0, Activations::Q8_0 { .. }) => {
            dot_q4_0::<1, R>([w], std::array::from_fn(|i| acts.q8_0_row(r0 + i)))[0]
        }
        (GgmlType::Q5_0, Activations::Q8_0 { .. }) => {
            dot_q5_0::<1, R>([w], std::array::from_fn(|i| acts.q8_0_row(r0 + i)))[0]
        }
        (GgmlType::Q4_1, Activations::Q8_1 { .. }) => {
            dot_q4_1::<R>(w, std::array::from_fn(|i| acts.q8_1_row(r0 + i)))
        }
        (GgmlType::Q5_1, Activations::Q8_1 { .. }) => {
            dot_q5_1::<R>(w, std::array::from_fn(|i| acts.q8_1_row(r0 + i)))
        }
        (GgmlType::Q4K, Activations::Q8K { .. }) => {
            dot_q45k::<false, R>(w, std::array::from_fn(|i| acts.q8k_row(r0 + i)))
        }
        (GgmlType::Q5K, Activations::Q8K { .. }) => {
            dot_q45k::<true, R>(w, std::array::from_fn(|i| acts.q8k_row(r0 + i)))
        }
        (GgmlType::Q6K, Activations::Q8K { .. }) => {
            dot_q6k::<R>(w, std::array::from_fn(|i| acts.q8k_row(r0 + i)))
        }
        _ => panic!("activation format does not match weight type {t:?}"),
    }
}

/// Sum of 8 i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
}

/// One little-endian f16 at `b[off..off+2]` converted with F16C (half's converter is not inlined
/// here and a call per block costs more than the block's arithmetic).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_at(b: &[u8], off: usize) -> f32 {
    let bits = std::ptr::read_unaligned(b.as_ptr().add(off) as *const u16);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
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
        /// W weight rows against R activation rows; each output keeps the one-row operation order.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const W: usize, const R: usize>(
            ws: [&[u8]; W],
            ys: [&[BlockQ8_0]; R],
        ) -> [[f32; R]; W] {
            let mut acc = [[_mm256_setzero_ps(); R]; W];
            for i in 0..ys[0].len() {
                for w in 0..W {
                    let $b = ws[w].as_ptr().add(i * $bytes);
                    let dw = f16_at(ws[w], i * $bytes);
                    let qx: __m256i = $load;
                    let ax = _mm256_sign_epi8(qx, qx);
                    for r in 0..R {
                        let yb = &ys[r][i];
                        let sy = _mm256_sign_epi8(load(yb.qs.as_ptr() as *const u8), qx);
                        let p =
                            _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
                        acc[w][r] = _mm256_fmadd_ps(
                            _mm256_set1_ps(dw * yb.d),
                            _mm256_cvtepi32_ps(p),
                            acc[w][r],
                        );
                    }
                }
            }
            std::array::from_fn(|w| std::array::from_fn(|r| hsum_ps(acc[w][r])))
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

macro_rules! dot_vs_q8_1 {
    ($name:ident, $bytes:expr, |$b:ident| $load:expr) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const R: usize>(w: &[u8], ys: [&[BlockQ8_1]; R]) -> [f32; R] {
            let mut acc = [_mm256_setzero_ps(); R];
            let mut mins = [0.0f32; R];
            for i in 0..ys[0].len() {
                let $b = w.as_ptr().add(i * $bytes);
                let (dw, mw) = (f16_at(w, i * $bytes), f16_at(w, i * $bytes + 2));
                let qx: __m256i = $load;
                for r in 0..R {
                    let yb = &ys[r][i];
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

/// Q4_K and Q5_K share everything but the 5th bit (`HIGH`) and how llama.cpp accumulates the
/// mins term (kept identical here): Q4_K in 4 float lanes, Q5_K in one fused scalar sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q45k<const HIGH: bool, const R: usize>(w: &[u8], ys: [&[BlockQ8K]; R]) -> [f32; R] {
    let bytes = if HIGH { 176 } else { 144 };
    let qs_at = if HIGH { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins4 = [[0.0f32; 4]; R];
    let mut mins1 = [0.0f32; R];
    for i in 0..ys[0].len() {
        let b = &w[i * bytes..(i + 1) * bytes];
        let (sc, m) = scales_mins(&b[4..16]);
        let (dw, dminw) = (f16_at(b, 0), f16_at(b, 2));
        let mins8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(m.as_ptr() as *const __m128i));
        for r in 0..R {
            let y = &ys[r][i];
            let neg_dmin = -y.d * dminw;
            // prod[k] = m[2k]*(bsum pair 2k) + m[2k+1]*(bsum pair 2k+1): the same 4 lanes as llama.cpp.
            let bs = y.bsums.as_ptr() as *const __m128i;
            let q8s = _mm_hadd_epi16(_mm_loadu_si128(bs), _mm_loadu_si128(bs.add(1)));
            let prod = _mm_madd_epi16(mins8, q8s);
            if HIGH {
                let total = _mm_hadd_epi32(_mm_hadd_epi32(prod, prod), prod);
                mins1[r] = neg_dmin.mul_add(_mm_cvtsi128_si32(total) as f32, mins1[r]);
            } else {
                let lanes = _mm_fmadd_ps(
                    _mm_set1_ps(neg_dmin),
                    _mm_cvtepi32_ps(prod),
                    _mm_loadu_ps(mins4[r].as_ptr()),
                );
                _mm_storeu_ps(mins4[r].as_mut_ptr(), lanes);
            }
        }
        let qh = if HIGH {
            load(b.as_ptr().add(16))
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); R];
        for c in 0..4 {
            let raw = load(b.as_ptr().add(qs_at + 32 * c));
            let mut lo = _mm256_and_si256(raw, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
            if HIGH {
                let bit_lo =
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
                let bit_hi = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                    one,
                );
                lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(bit_lo));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(bit_hi));
            }
            let (s_lo, s_hi) = (
                _mm256_set1_epi16(sc[2 * c] as i16),
                _mm256_set1_epi16(sc[2 * c + 1] as i16),
            );
            for r in 0..R {
                let q8 = ys[r][i].qs.as_ptr() as *const u8;
                let plo = _mm256_maddubs_epi16(lo, load(q8.add(64 * c)));
                let phi = _mm256_maddubs_epi16(hi, load(q8.add(64 * c + 32)));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(plo, s_lo));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(phi, s_hi));
            }
        }
        for r in 0..R {
            let d = dw * ys[r][i].d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    std::array::from_fn(|r| {
        let m = &mins4[r];
        hsum_ps(acc[r])
            + if HIGH {
                mins1[r]
            } else {
                (m[0] + m[2]) + (m[1] + m[3])
            }
    })
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6k<const R: usize>(w: &[u8], ys: [&[BlockQ8K]; R]) -> [f32; R] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..ys[0].len() {
        let b = &w[i * 210..(i + 1) * 210];
        let scales: [i8; 16] = std::array::from_fn(|k| b[192 + k] as i8);
        // The -32 offset, folded into the exact integer sum through the Q8_K block sums.
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr().add(192) as *const __m128i));
        let mut sumi: [__m256i; R] = std::array::from_fn(|r| {
            let bs = _mm256_loadu_si256(ys[r][i].bsums.as_ptr() as *const __m256i);
            // -32 * sum(scale[k] * bsum[k]) added to lane 0: the same exact integer total.
            _mm256_setr_epi32(
                -32 * hsum_epi32(_mm256_madd_epi16(sc16, bs)),
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            )
        });
        for n in 0..2 {
            let a = load(b.as_ptr().add(64 * n));
            let c = load(b.as_ptr().add(64 * n + 32));
            let h = load(b.as_ptr().add(128 + 32 * n));
            let quads = [
                _mm256_or_si256(_mm256_and_si256(a, m4), q6_high_bits(h, 0, m3)),
                _mm256_or_si256(_mm256_and_si256(c, m4), q6_high_bits(h, 2, m3)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
                    q6_high_bits(h, 4, m3),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4),
                    q6_high_bits(h, 6, m3),
                ),
            ];
            for (j, q) in quads.iter().enumerate() {
                let k = 8 * n + 2 * j;
                let sv = _mm256_set_m128i(
                    _mm_set1_epi16(scales[k + 1] as i16),
                    _mm_set1_epi16(scales[k] as i16),
                );
                for r in 0..R {
                    let q8 = ys[r][i].qs.as_ptr() as *const u8;
                    let p = _mm256_maddubs_epi16(*q, load(q8.add(128 * n + 32 * j)));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sv));
                }
            }
        }
        for r in 0..R {
            let d = f16_at(b, 208) * ys[r][i].d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    std::array::from_fn(|r| hsum_ps(acc[r]))
}

/// Bits `s, s+1` of each byte of `h`, moved to bits 4-5.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_high_bits(h: __m256i, s: i32, m3: __m256i) -> __m256i {
    _mm256_slli_epi16::<4>(_mm256_and_si256(
        _mm256_srl_epi16(h, _mm_cvtsi32_si128(s)),
        m3,
    ))
}

/// Float rows: four 8-lane accumulators over 32-element steps, a scalar tail, like ggml.
macro_rules! dot_float {
    ($name:ident, $wt:ty, $at:ty, |$p:ident| $load_w:expr, |$q:ident| $load_a:expr, $scalar_w:expr, $scalar_a:expr) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(w: &[u8], a: &[$at]) -> f32 {
            let n = a.len();
            let wp = w.as_ptr() as *const $wt;
            let mut acc = [_mm256_setzero_ps(); 4];
            let steps = n / 32;
            for s in 0..steps {
                for (k, accum) in acc.iter_mut().enumerate() {
                    let off = 32 * s + 8 * k;
                    let $p = wp.add(off);
                    let $q = a.as_ptr().add(off);
                    *accum = _mm256_fmadd_ps($load_w, $load_a, *accum);
                }
            }
            let total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut sum = hsum_ps(total);
            for i in 32 * steps..n {
                let wv: $wt = std::ptr::read_unaligned(wp.add(i));
                sum += $scalar_w(wv) * $scalar_a(a[i]);
            }
            sum
        }
    };
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
    dot_f32,
    f32,
    f32,
    |p| _mm256_loadu_ps(p),
    |q| _mm256_loadu_ps(q),
    |v: f32| v,
    |v: f32| v
);
dot_float!(
    dot_f16,
    u16,
    u16,
    |p| load_f16x8(p),
    |q| load_f16x8(q),
    f16_bits_to_f32,
    f16_bits_to_f32
);
dot_float!(
    dot_bf16,
    u16,
    u16,
    |p| load_bf16x8(p),
    |q| load_bf16x8(q),
    bf16_bits_to_f32,
    bf16_bits_to_f32
);

/// `sum(a[i] * f16(b[i]))` for attention scores.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32_f16(a: &[f32], b: &[u16]) -> f32 {
    let n = a.len();
    let mut acc = [_mm256_setzero_ps(); 2];
    let steps = n / 16;
    for s in 0..steps {
        for (k, accum) in acc.iter_mut().enumerate() {
            let off = 16 * s + 8 * k;
            *accum = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(off)),
                load_f16x8(b.as_ptr().add(off)),
                *accum,
            );
        }
    }
    let mut sum = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    for i in 16 * steps..n {
        sum += a[i] * f16_bits_to_f32(b[i]);
    }
    sum
}

/// `y += alpha * f16(x)` for attention's weighted sum of values.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `y.len() == x.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16(y: &mut [f32], alpha: f32, x: &[u16]) {
    let n = y.len();
    let va = _mm256_set1_ps(alpha);
    let steps = n / 8;
    for s in 0..steps {
        let p = y.as_mut_ptr().add(8 * s);
        _mm256_storeu_ps(
            p,
            _mm256_fmadd_ps(va, load_f16x8(x.as_ptr().add(8 * s)), _mm256_loadu_ps(p)),
        );
    }
    for i in 8 * steps..n {
        y[i] += alpha * f16_bits_to_f32(x[i]);
    }
}
