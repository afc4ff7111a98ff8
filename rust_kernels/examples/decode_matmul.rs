//! Time one weight matrix against m activation rows (a decode step of m sequences) on the kernel
//! pool, for the multi-row decode path. Random quants, sane scales, weights bigger than the caches.
//!
//! `cargo run --release --example decode_matmul -- Q8_0 262144 640 [threads [reps [m,m,.. [path]]]]`
//! prints per m: median ms of `--reps` calls and the ratio to m = 1; `path` caps the kernel path
//! (scalar, avx2, avx512vnni). Environment: `IDLE_US=n` sleeps n µs before each call (the pool's
//! threads may park, as between a model's kernel calls); `FLUSH=1` reads 64 MiB before each call
//! (the weights then come from memory, as in a decode step, even when they would fit the caches;
//! the pool's threads park during that read). `COPIES=n` calls n copies of the matrix in turn, back
//! to back with the threads awake, as a model's layers stream one after another: with the copies
//! past the caches (e.g. 100 x 2 MiB), each call reads its weights from memory.

use _native::matmul::{matmul_many, Weight};
use _native::quant::GgmlType;
use _native::{simd, threads};
use std::time::Instant;

fn parse_type(s: &str) -> GgmlType {
    match s {
        "Q8_0" => GgmlType::Q8_0,
        "Q4_0" => GgmlType::Q4_0,
        "Q5_0" => GgmlType::Q5_0,
        "Q4_1" => GgmlType::Q4_1,
        "Q5_1" => GgmlType::Q5_1,
        "Q4_K" => GgmlType::Q4K,
        "Q5_K" => GgmlType::Q5K,
        "Q6_K" => GgmlType::Q6K,
        "F16" => GgmlType::F16,
        "BF16" => GgmlType::BF16,
        "F32" => GgmlType::F32,
        _ => panic!("unknown type {s}"),
    }
}

/// Byte offsets of a block's f16 scales (random bits there could be NaN or denormal).
fn scale_offsets(t: GgmlType) -> &'static [usize] {
    match t {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut [i64; 2]) -> i32;
}

/// CPU time of the calling thread in ms (robust to other work on a shared machine, unlike wall
/// time; with 1 thread it is the whole call's CPU time).
fn cpu_ms() -> f64 {
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = [0i64; 2];
    // SAFETY: ts is a valid timespec (two i64 on x86_64 Linux) for the duration of the call.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts[0] as f64 * 1e3 + ts[1] as f64 / 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let t = parse_type(&args[1]);
    let rows: usize = args[2].parse().unwrap();
    let cols: usize = args[3].parse().unwrap();
    let n_threads: usize = args.get(4).map_or(2, |s| s.parse().unwrap());
    let reps: usize = args.get(5).map_or(15, |s| s.parse().unwrap());
    threads::set_num_threads(n_threads);
    let bb = t.block_bytes();
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut data: Vec<u8> = (0..rows * t.row_bytes(cols))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    if t.block_len() > 1 {
        for b in data.chunks_exact_mut(bb) {
            for &o in scale_offsets(t) {
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
        }
    } else if t == GgmlType::F32 {
        data.chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&0.5f32.to_le_bytes()));
    } else {
        data.chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&0x3800u16.to_le_bytes()));
    }
    let copies: usize = std::env::var("COPIES").map_or(1, |v| v.parse().unwrap());
    let data = data.repeat(copies);
    let ws: Vec<Weight> = data
        .chunks_exact(rows * t.row_bytes(cols))
        .map(|data| Weight {
            t,
            data,
            rows,
            cols,
        })
        .collect();
    // Optional 6th argument: the m values, comma-separated (e.g. 512 for a prompt).
    let ms: Vec<usize> = args.get(6).map_or(vec![1, 2, 3, 4, 8, 16], |s| {
        s.split(',').map(|v| v.parse().unwrap()).collect()
    });
    if let Some(p) = args.get(7) {
        simd::set_ceiling(simd::Path::from_name(p).expect("path: scalar, avx2 or avx512vnni"));
    }
    println!("kernel path: {}", simd::path_name());
    let idle_us: Option<u64> = std::env::var("IDLE_US").ok().map(|v| v.parse().unwrap());
    let flush = std::env::var_os("FLUSH").map(|_| vec![1u64; 8 << 20]);
    let mut base = 0.0;
    for &m in &ms {
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut out = vec![0.0f32; m * rows];
        let mut times = Vec::new();
        let mut cpu = 0.0;
        for rep in 0..reps {
            let w = ws[rep % copies];
            if let Some(us) = idle_us {
                // the kernel threads park while the caller is away, as between a model's calls
                std::thread::sleep(std::time::Duration::from_micros(us));
            }
            if let Some(f) = &flush {
                // evict the weights: each rep reads them from memory, as in a model's decode step
                std::hint::black_box(f.iter().fold(0u64, |a, &v| a.wrapping_add(v)));
            }
            let (t0, c0) = (Instant::now(), cpu_ms());
            threads::run(|| matmul_many(&[w], &x, m, &mut [&mut out], None));
            times.push(t0.elapsed().as_secs_f64() * 1e3);
            cpu += cpu_ms() - c0;
        }
        let cpu = cpu / reps as f64;
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let med = times[reps / 2];
        if base == 0.0 {
            base = med;
        }
        let blocks = (rows * cols / t.block_len() * m) as f64;
        println!(
            "{t:?} {rows}x{cols} m={m:2}: {med:8.4} ms ({:.2}x m=1), calling thread's cpu {cpu:.3} ms = {:.2} ns/block-row",
            med / base,
            cpu * 1e6 / blocks
        );
    }
}
