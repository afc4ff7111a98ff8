//! The kernels' own rayon pools, so the thread count is set by the service, not by rayon's default.
//!
//! Handing a call to a pool from outside it costs a wake-up of a pool thread and another of the
//! caller when the work is done (~15 µs, far more on a loaded machine), paid by every kernel call.
//! So each thread that calls kernels gets a pool of its own that it is itself part of (rayon's
//! `use_current_thread`): a call runs on the calling thread at once, and the other `n - 1` threads
//! steal parts of the work as they wake up; work too small to be worth stealing is simply done by
//! the caller. Which thread computes a part never changes its bits: kernels only split work into
//! independent outputs, each with a fixed reduction order.
//!
//! After each call the pool's other threads spin briefly for the next one (`keep_warm`): a decode
//! step's ~100 small calls otherwise each waited for a parked thread to wake.
//!
//! A thread can belong to one pool only, for good: after `set_num_threads` changes the count, a
//! thread whose own pool has another size uses the shared pool (the old hand-off) until the count
//! is set back.

use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

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
    let mut pool = slot().write().unwrap();
    if pool.current_num_threads() != n.max(1) {
        *pool = Arc::new(build(n));
    }
}

pub fn num_threads() -> usize {
    slot().read().unwrap().current_num_threads()
}

thread_local! {
    /// This thread's own pool (the thread is its worker 0) once made; `Some(None)` where it cannot
    /// have one (it is already a worker of some pool).
    static OWN: RefCell<Option<Option<Arc<ThreadPool>>>> = const { RefCell::new(None) };
}

fn own_pool(n: usize) -> Option<Arc<ThreadPool>> {
    OWN.with(|own| {
        own.borrow_mut()
            .get_or_insert_with(|| {
                ThreadPoolBuilder::new()
                    .num_threads(n)
                    .use_current_thread()
                    .thread_name(|i| format!("hyserve-kernel-{i}"))
                    .build()
                    .ok()
                    .map(Arc::new)
            })
            .clone()
    })
}

/// Run `f` inside the kernel pool (rayon calls in `f` use its threads): on the calling thread's
/// own pool when it has the configured size (`install` then calls `f` right here), else on the
/// shared one. Afterwards the pool's other threads stay awake for a short while (`keep_warm`).
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let shared = slot().read().unwrap().clone();
    let n = shared.current_num_threads();
    let call = CALLS.fetch_add(1, Ordering::AcqRel) + 1;
    let (r, pool) = match own_pool(n) {
        Some(pool) if pool.current_num_threads() == n => (pool.install(f), pool),
        _ => (shared.install(f), shared),
    };
    keep_warm(&pool, call);
    r
}

/// Kernel calls started so far (a keep-warm spinner stops when it changes).
static CALLS: AtomicU64 = AtomicU64::new(0);

/// How long a pool thread spins for the next kernel call before it goes back to rayon (which
/// soon parks it). A decode step makes ~100 kernel calls with Python in between (norms, the
/// recurrent state, sampling, usually 10-100 µs); a parked thread took ~30 µs to join the next
/// call, which then ran on the caller alone until it did (+30 µs on a 40 µs matmul, measured with
/// `IDLE_US` in the `decode_matmul` example).
const KEEP_WARM: Duration = Duration::from_micros(300);

/// Occupy each of the pool's other threads with a spin that ends at the next kernel call (then the
/// thread is awake to steal its part at once) or after `KEEP_WARM`.
fn keep_warm(pool: &ThreadPool, call: u64) {
    for _ in 1..pool.current_num_threads() {
        pool.spawn(move || {
            let deadline = Instant::now() + KEEP_WARM;
            // The clock is read once per 64 pauses: read every turn it was most of the spin (perf).
            while Instant::now() < deadline {
                for _ in 0..64 {
                    if CALLS.load(Ordering::Acquire) != call {
                        return;
                    }
                    std::hint::spin_loop();
                }
            }
        });
    }
}

/// Elements below which a row-wise or element-wise kernel runs on the calling thread alone (a
/// decode step's rows): handing so little to the pool costs more than it saves.
const SPLIT_MIN_ELEMENTS: usize = 1 << 15;

/// `f(first_row, out_rows)` over chunks of whole rows of `out` (rows of `n`), split across the
/// current rayon pool: a few chunks per thread, so a slow thread does not hold up the call. Each
/// row is computed by one call of `f`, whichever thread runs it, so the bits do not depend on the
/// split. Small `out` runs as one call on this thread.
pub fn par_rows(out: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() < SPLIT_MIN_ELEMENTS || n == 0 {
        return f(0, out);
    }
    let rows = out.len() / n;
    let per = rows.div_ceil(4 * rayon::current_num_threads()).max(1);
    out.par_chunks_mut(per * n)
        .enumerate()
        .for_each(|(i, o)| f(i * per, o));
}

/// `par_rows` entered from outside the kernel pool (a binding): small work stays on the caller
/// without touching the pool.
pub fn run_rows(out: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() < SPLIT_MIN_ELEMENTS || n == 0 {
        return f(0, out);
    }
    run(|| par_rows(out, n, f));
}
