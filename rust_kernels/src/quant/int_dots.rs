//! The integer-quant dot products on x86-64 (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 here, Q4_K, Q5_K, Q6_K in
//! `kquant_dots`, against their quantized activations), each written once with a `VNNI` switch and
//! compiled twice: for AVX2 (maddubs + madd, as llama.cpp's x86 kernels) and, where the CPU has
//! AVX-512 VNNI, on the same 256-bit registers with `vpdpbusd` / `vpdpwssd` fusing a widening
//! multiply with its sum. The integer lane sums are exact in both forms (no format reaches maddubs'
//! i16 saturation), and the float operations are the same, so both give the same bits: each block
//! adds one FMA into an 8-lane float accumulator in block order, reduced once at the end, an order
//! that depends only on the row length, never on the batch.

use super::blocks::{BlockQ8_0, BlockQ8_0Biased, BlockQ8_1};
use super::x86::{compiled_twice, f16_at, hsum_ps, load, opaque, read_u32};
use super::RowRun;
use std::arch::x86_64::*;

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles first (elements 0..15), then high nibbles.
/// The 16 bytes are loaded into both halves and the high half shifted by 4 (bits that move in from
/// the next byte land in the masked-off high nibble): one load, two operations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    let v = _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// The 32 quants of a Q5_0 (`SIGNED`: as `q - 16`) or Q5_1 (as `q`, unsigned) block from `b`,
/// where its 4 bytes of 5th bits precede its 16 bytes of nibbles. AVX2 spreads the bits to bytes
/// (a shuffle and a compare) and merges them in: for Q5_0 by setting the top nibble where the
/// bit is clear (the byte then reads as `q - 16` in two's complement). AVX-512BW adds or subtracts
/// 16 under the bit mask itself instead, in one operation.
#[inline(always)]
unsafe fn q5_quants<const SIGNED: bool, const AVX512: bool>(b: *const u8) -> __m256i {
    let nib = nibbles32(b.add(4));
    let fifth = read_u32(b);
    let sixteen = _mm256_set1_epi8(16);
    match (SIGNED, AVX512) {
        (true, true) => _mm256_mask_sub_epi8(nib, !fifth, nib, sixteen),
        (false, true) => _mm256_mask_add_epi8(nib, fifth, nib, sixteen),
        (true, false) => {
            let top = _mm256_andnot_si256(bits32(fifth), _mm256_set1_epi8(0xF0u8 as i8));
            _mm256_or_si256(nib, top)
        }
        (false, false) => _mm256_or_si256(nib, _mm256_and_si256(bits32(fifth), sixteen)),
    }
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

/// Sum of products of 32 unsigned bytes with 32 signed bytes, 4 adjacent products per i32 lane.
/// Exact in both forms while no adjacent pair of products passes the i16 range (maddubs saturates):
/// every caller has unsigned bytes <= 128 and signed bytes in -127..=127.
#[inline(always)]
unsafe fn dot_u8_i8<const VNNI: bool>(x: __m256i, y: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }
}

macro_rules! dot_vs_q8_0 {
    ($name:ident, $bytes:expr, |$b:ident| $load:expr) => {
        /// One weight row against R activation rows; each output keeps the one-row operation order.
        /// Where the rows' biased form is given (`Activations` keeps it for several rows), the
        /// VNNI form reads it instead of the blocks: see `biased_sums_start`.
        #[inline(always)]
        pub(super) unsafe fn $name<const R: usize, const VNNI: bool>(
            w: &[u8],
            ys: [&[BlockQ8_0]; R],
            biased: Option<[&[BlockQ8_0Biased]; R]>,
        ) -> [f32; R] {
            #[inline(always)]
            unsafe fn rows<const R: usize, const VNNI: bool, const BIASED: bool>(
                w: &[u8],
                ys: [&[BlockQ8_0]; R],
                us: [&[BlockQ8_0Biased]; R],
            ) -> [f32; R] {
                let nb = ys[0].len();
                assert!(w.len() >= nb * $bytes && ys.iter().all(|y| y.len() == nb));
                assert!(!BIASED || us.iter().all(|u| u.len() == nb));
                let mut acc = [_mm256_setzero_ps(); R];
                for i in 0..nb {
                    let $b = w.as_ptr().add(i * $bytes);
                    let dw = f16_at(w, i * $bytes);
                    let qx: __m256i = $load;
                    let (ax, start) = if BIASED {
                        (_mm256_setzero_si256(), biased_sums_start(qx))
                    } else {
                        (_mm256_sign_epi8(qx, qx), _mm256_setzero_si256())
                    };
                    // dw * yd as a vector product of two broadcasts (the same IEEE product): the
                    // row's scale then costs a broadcast load and one multiply, no shuffle.
                    let bdw = opaque(_mm256_set1_ps(dw));
                    for r in 0..R {
                        // Biased: only the biased blocks are read (the same bytes a block).
                        let (p, yd) = if BIASED {
                            let ub = us[r].get_unchecked(i);
                            (_mm256_dpbusd_epi32(start, load(ub.u.as_ptr()), qx), &ub.d)
                        } else {
                            let yb = ys[r].get_unchecked(i);
                            let sy = _mm256_sign_epi8(load(yb.qs.as_ptr() as *const u8), qx);
                            (dot_u8_i8::<VNNI>(ax, sy), &yb.d)
                        };
                        let d = _mm256_mul_ps(bdw, _mm256_broadcast_ss(yd));
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
            match biased {
                Some(us) if VNNI => rows::<R, VNNI, true>(w, ys, us),
                _ => rows::<R, VNNI, false>(w, ys, [&[]; R]),
            }
        }
    };
}

/// The integer sums of the VNNI kernels of several activation rows against signed weight quants
/// `w` (Q8_0, Q4_0, Q5_0): `vpdpbusd` multiplies unsigned by signed bytes, so instead of flipping
/// each activation byte by its weight's sign (`vpsignb`, per row and block) the rows come biased
/// by +128 (`u = y + 128`, `Activations` keeps that copy) and each i32 lane starts at -128 x the
/// sum of its four weights, once per block for all rows: `start + sum(u * w) = sum(y * w)`, the
/// same integers, so the same bits. The sign flips would compete for the execution ports of the
/// `vpdpbusd`s, multiplies and FMAs, which bound the loop.
#[inline(always)]
unsafe fn biased_sums_start(w: __m256i) -> __m256i {
    let plus128 = _mm256_set1_epi8(-128i8); // 0x80: 128 as an unsigned byte
    let bias = _mm256_dpbusd_epi32(_mm256_setzero_si256(), plus128, w);
    _mm256_sub_epi32(_mm256_setzero_si256(), bias)
}

dot_vs_q8_0!(dot_q8_0, 34, |b| load(b.add(2)));
dot_vs_q8_0!(dot_q4_0, 18, |b| _mm256_sub_epi8(
    nibbles32(b.add(2)),
    _mm256_set1_epi8(8)
));
dot_vs_q8_0!(dot_q5_0, 22, |b| q5_quants::<true, VNNI>(b.add(2)));

/// The biased kernels over a run of weight rows (one output per row), compiled for AVX-512 VNNI
/// (the only path that keeps biased rows): see `vec_dot_act_rows_run`. The loop over the rows lives
/// here, not in the caller, so the call and its dispatch come once per run, not once per row.
macro_rules! biased_run {
    ($name:ident, $kernel:ident) => {
        #[inline(never)]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(super) unsafe fn $name<const R: usize>(
            rows: &RowRun,
            ys: [&[BlockQ8_0]; R],
            us: [&[BlockQ8_0Biased]; R],
            out: &mut [[f32; R]],
        ) {
            for (j, o) in out.iter_mut().enumerate() {
                *o = $kernel::<R, true>(rows.row(j), ys, Some(us));
            }
        }
    };
}

biased_run!(q8_0_biased_run, dot_q8_0);
biased_run!(q4_0_biased_run, dot_q4_0);
biased_run!(q5_0_biased_run, dot_q5_0);

/// Q8_0 activation rows as the kernels take them: the blocks and, where kept, their biased quants
/// (`biased_sums_start`).
pub(super) type Q8_0Rows<'a, const R: usize> =
    ([&'a [BlockQ8_0]; R], Option<[&'a [BlockQ8_0Biased]; R]>);

// `dot_q8_0` for R > 1 activation rows as a function of its own: inlined into
// `vec_dot_act_rows`' large match, LLVM kept the R accumulators on the stack (a store per row and
// block).
compiled_twice!(
    dot_q8_0_rows,
    dot_q8_0_rows_avx2,
    dot_q8_0_rows_vnni,
    |w, ys: Q8_0Rows<'_, R>| dot_q8_0::<R, VNNI>(w, ys.0, ys.1)
);

macro_rules! dot_vs_q8_1 {
    ($name:ident, $bytes:expr, |$b:ident| $load:expr) => {
        #[inline(always)]
        pub(super) unsafe fn $name<const R: usize, const VNNI: bool>(
            w: &[u8],
            ys: [&[BlockQ8_1]; R],
        ) -> [f32; R] {
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
                    let p = dot_u8_i8::<VNNI>(qx, load(yb.qs.as_ptr() as *const u8));
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_set1_ps(dw * yb.d), _mm256_cvtepi32_ps(p), acc[r]);
                }
            }
            std::array::from_fn(|r| hsum_ps(acc[r]) + mins[r])
        }
    };
}

dot_vs_q8_1!(dot_q4_1, 20, |b| nibbles32(b.add(4)));
dot_vs_q8_1!(dot_q5_1, 24, |b| q5_quants::<false, VNNI>(b.add(4)));
