//! Run-time choice of the kernel path: AVX-512 VNNI (the integer-quant dot products on 256-bit
//! registers with `vpdpbusd`/`vpdpwssd`; everything else as AVX2), AVX2, or the portable scalar
//! path. All three give the same bits; a ceiling set by tests and benchmarks picks a lower one.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Kernel paths, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Path {
    Scalar = 0,
    Avx2 = 1,
    Vnni = 2,
}

impl Path {
    /// Every path, lowest first (indexed by the discriminant).
    const ALL: [Path; 3] = [Path::Scalar, Path::Avx2, Path::Vnni];

    pub fn name(self) -> &'static str {
        match self {
            Path::Scalar => "scalar",
            Path::Avx2 => "avx2",
            Path::Vnni => "avx512vnni",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

static CEILING: AtomicU8 = AtomicU8::new(Path::Vnni as u8);

/// The best path this CPU (and OS) supports; every lower path is supported too (the VNNI path
/// needs AVX2 as well).
fn cpu_best() -> Path {
    static BEST: OnceLock<Path> = OnceLock::new();
    *BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let vnni = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni");
            match (avx2, vnni) {
                (true, true) => Path::Vnni,
                (true, false) => Path::Avx2,
                _ => Path::Scalar,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Path::Scalar
        }
    })
}

/// The path the kernels take now: the CPU's best, capped by the ceiling.
#[inline]
pub fn path() -> Path {
    cpu_best().min(Path::ALL[CEILING.load(Ordering::Relaxed) as usize])
}

/// True when the AVX2/FMA/F16C kernels run (the AVX-512 VNNI path runs them too).
#[inline]
pub fn use_avx2() -> bool {
    path() >= Path::Avx2
}

/// True when the integer-quant dot products take their AVX-512 VNNI form.
#[inline]
pub fn use_vnni() -> bool {
    path() == Path::Vnni
}

/// Cap the path (process-wide; for tests and for comparing paths): the CPU's best path at or
/// below `ceiling` runs.
pub fn set_ceiling(ceiling: Path) {
    CEILING.store(ceiling as u8, Ordering::Relaxed);
}

/// Force the scalar reference path, or lift every cap (process-wide).
pub fn set_force_scalar(force: bool) {
    set_ceiling(if force { Path::Scalar } else { Path::Vnni });
}

pub fn path_name() -> &'static str {
    path().name()
}

/// Ask for `len` bytes of `data` from offset `from` (clipped to the slice) to be brought into L2.
/// The weight streams use it; L2 rather than L1 (`T1`, not `T0`): an L1 prefetch holds one of
/// the core's few L1 miss buffers until its line arrives, which capped how many lines of the
/// stream were in flight. (`NTA`, which bypasses the caches, is slower still.)
#[inline(always)]
pub fn prefetch(data: &[u8], from: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let end = (from + len).min(data.len());
        let mut p = from;
        while p < end {
            // SAFETY: p < data.len(); a prefetch never faults and changes no memory.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(data.as_ptr().add(p) as *const i8) };
            p += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, from, len);
}
