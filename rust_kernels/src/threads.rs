//! The kernels' own rayon pool, so the thread count is set by the service, not by rayon's default.

use rayon::{ThreadPool, ThreadPoolBuilder};
use std::sync::{Arc, OnceLock, RwLock};

fn slot() -> &'static RwLock<Arc<ThreadPool>> {
    static POOL: OnceLock<RwLock<Arc<ThreadPool>>> = OnceLock::new();
    POOL.get_or_init(|| {
        RwLock::new(Arc::new(build(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        )))
    })
}

fn build(n: usize) -> ThreadPool {
    ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .thread_name(|i| format!("hyserve-kernel-{i}"))
        .build()
        .expect("cannot start kernel threads")
}

pub fn set_num_threads(n: usize) {
    *slot().write().unwrap() = Arc::new(build(n));
}

pub fn num_threads() -> usize {
    slot().read().unwrap().current_num_threads()
}

/// Run `f` inside the kernel pool (rayon calls in `f` use its threads).
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let pool = slot().read().unwrap().clone();
    pool.install(f)
}
