//! Run-time choice between the AVX2 path and the portable scalar path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static FORCE_SCALAR: AtomicBool = AtomicBool::new(false);

fn cpu_has_avx2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// True when the AVX2/FMA/F16C kernels run (the CPU has them and the scalar path is not forced).
#[inline]
pub fn use_avx2() -> bool {
    !FORCE_SCALAR.load(Ordering::Relaxed) && cpu_has_avx2()
}

/// Force the scalar reference path (for tests and for comparing paths); process-wide.
pub fn set_force_scalar(force: bool) {
    FORCE_SCALAR.store(force, Ordering::Relaxed);
}

pub fn path_name() -> &'static str {
    if use_avx2() {
        "avx2"
    } else {
        "scalar"
    }
}
