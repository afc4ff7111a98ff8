//! The register-level steps the x86-64 dot products (`avx2`, `int_dots`, `kquant_dots`) share:
//! one f16 scale converted in a register of its own, values hidden from the optimizer, the
//! horizontal sum, unaligned loads, and the macro that compiles one kernel body for AVX2 and for
//! AVX-512 VNNI. A leaf: it imports nothing of the crate.

use std::arch::x86_64::*;

/// One kernel body (an `#[inline(always)]` expression generic over `VNNI`) compiled as a function
/// of its own per instruction set, `$avx2` and `$vnni` (the features `simd::use_vnni` checks the
/// CPU for; never inlined: inside the caller's large match LLVM kept the accumulators on the
/// stack), and `$pick`, which calls the one for `VNNI`.
macro_rules! compiled_twice {
    ($pick:ident, $avx2:ident, $vnni:ident, |$w:ident, $ys:ident: $yt:ty| $body:expr) => {
        #[inline(never)]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $avx2<const R: usize>($w: &[u8], $ys: $yt) -> [f32; R] {
            const VNNI: bool = false;
            $body
        }

        #[inline(never)]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn $vnni<const R: usize>($w: &[u8], $ys: $yt) -> [f32; R] {
            const VNNI: bool = true;
            $body
        }

        #[inline(always)]
        pub(super) unsafe fn $pick<const R: usize, const VNNI: bool>(
            $w: &[u8],
            $ys: $yt,
        ) -> [f32; R] {
            if VNNI {
                $vnni::<R>($w, $ys)
            } else {
                $avx2::<R>($w, $ys)
            }
        }
    };
}
pub(super) use compiled_twice;

/// One little-endian f16 at `b[off..off+2]` converted with F16C (half's converter is not inlined
/// here and a call per block costs more than the block's arithmetic). The conversion is inline asm
/// because LLVM narrows `_mm_cvtph_ps` of one lane to a `vpinsrw` into whatever register it likes,
/// often the float accumulator: that chained every block's scale to the previous block's FMA and
/// made Q8_0/Q5_0 rows latency-bound.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(b: &[u8], off: usize) -> f32 {
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
pub(super) unsafe fn opaque(mut v: __m256) -> __m256 {
    std::arch::asm!("/* {v} */", v = inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

/// `v` unchanged, hidden from the optimizer: a byte shuffle by a constant mask stays one `vpshufb`
/// (LLVM rewrites it into two or three word and dword shuffles, each as costly).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn opaque_i(mut v: __m256i) -> __m256i {
    std::arch::asm!("/* {v} */", v = inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

/// `opaque_i` for 128 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn opaque_x(mut v: __m128i) -> __m128i {
    std::arch::asm!("/* {v} */", v = inout(xmm_reg) v, options(pure, nomem, nostack, preserves_flags));
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

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn read_u32(p: *const u8) -> u32 {
    u32::from_le_bytes(std::ptr::read_unaligned(p as *const [u8; 4]))
}
