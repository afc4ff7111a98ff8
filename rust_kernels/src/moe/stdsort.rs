//! ggml's argsort: libstdc++'s `std::sort` (introsort), reproduced step for step.
//! std::sort is not stable; matching its exact algorithm is what makes ties between equal
//! probabilities pick the same experts as llama.cpp (rows of at most 16 experts behave like a
//! stable sort; longer rows depend on the partitioning).

const INSERTION_THRESHOLD: usize = 16;

/// Indices of `v` sorted by descending value, in the order libstdc++'s `std::sort` with
/// `v[a] > v[b]` leaves them.
pub fn argsort_desc(v: &[f32]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    let gt = |a: u32, b: u32| v[a as usize] > v[b as usize];
    let n = idx.len();
    if n > 1 {
        let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
        introsort_loop(&mut idx, 0, n, depth, &gt);
        final_insertion_sort(&mut idx, 0, n, &gt);
    }
    idx
}

fn introsort_loop(
    a: &mut [u32],
    first: usize,
    mut last: usize,
    mut depth: usize,
    comp: &impl Fn(u32, u32) -> bool,
) {
    while last - first > INSERTION_THRESHOLD {
        if depth == 0 {
            heap_sort(a, first, last, comp);
            return;
        }
        depth -= 1;
        let mid = first + (last - first) / 2;
        move_median_to_first(a, first, first + 1, mid, last - 1, comp);
        let cut = unguarded_partition(a, first + 1, last, first, comp);
        introsort_loop(a, cut, last, depth, comp);
        last = cut;
    }
}

fn move_median_to_first(
    a: &mut [u32],
    result: usize,
    x: usize,
    y: usize,
    z: usize,
    comp: &impl Fn(u32, u32) -> bool,
) {
    let (vx, vy, vz) = (a[x], a[y], a[z]);
    let median = if comp(vx, vy) {
        if comp(vy, vz) {
            y
        } else if comp(vx, vz) {
            z
        } else {
            x
        }
    } else if comp(vx, vz) {
        x
    } else if comp(vy, vz) {
        z
    } else {
        y
    };
    a.swap(result, median);
}

fn unguarded_partition(
    a: &mut [u32],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    comp: &impl Fn(u32, u32) -> bool,
) -> usize {
    loop {
        while comp(a[first], a[pivot]) {
            first += 1;
        }
        last -= 1;
        while comp(a[pivot], a[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        a.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort(
    a: &mut [u32],
    first: usize,
    last: usize,
    comp: &impl Fn(u32, u32) -> bool,
) {
    if last - first > INSERTION_THRESHOLD {
        insertion_sort(a, first, first + INSERTION_THRESHOLD, comp);
        for i in first + INSERTION_THRESHOLD..last {
            linear_insert(a, i, comp);
        }
    } else {
        insertion_sort(a, first, last, comp);
    }
}

fn insertion_sort(a: &mut [u32], first: usize, last: usize, comp: &impl Fn(u32, u32) -> bool) {
    for i in first + 1..last {
        if comp(a[i], a[first]) {
            let v = a[i];
            a.copy_within(first..i, first + 1);
            a[first] = v;
        } else {
            linear_insert(a, i, comp);
        }
    }
}

/// libstdc++'s unguarded linear insert; the `pos > 0` guard never fires where it is used.
fn linear_insert(a: &mut [u32], mut pos: usize, comp: &impl Fn(u32, u32) -> bool) {
    let v = a[pos];
    while pos > 0 && comp(v, a[pos - 1]) {
        a[pos] = a[pos - 1];
        pos -= 1;
    }
    a[pos] = v;
}

/// `std::partial_sort(first, last, last)`: make_heap, then sort_heap (introsort's depth fallback).
fn heap_sort(a: &mut [u32], first: usize, last: usize, comp: &impl Fn(u32, u32) -> bool) {
    let len = last - first;
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let v = a[first + parent];
            adjust_heap(a, first, parent, len, v, comp);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut end = last;
    while end - first > 1 {
        end -= 1;
        let v = a[end];
        a[end] = a[first];
        adjust_heap(a, first, 0, end - first, v, comp);
    }
}

fn adjust_heap(
    a: &mut [u32],
    first: usize,
    mut hole: usize,
    len: usize,
    value: u32,
    comp: &impl Fn(u32, u32) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if comp(a[first + child], a[first + child - 1]) {
            child -= 1;
        }
        a[first + hole] = a[first + child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        a[first + hole] = a[first + child - 1];
        hole = child - 1;
    }
    // push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(a[first + parent], value) {
            break;
        }
        a[first + hole] = a[first + parent];
        hole = parent;
    }
    a[first + hole] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_sort_stably() {
        let v = [0.5f32, 1.0, 0.5, 1.0, 0.25, 1.0];
        assert_eq!(argsort_desc(&v), vec![1, 3, 5, 0, 2, 4]);
    }

    /// Values with many ties, made by the same LCG as the C++ program that produced the goldens.
    fn tie_values(n: usize, levels: u64) -> Vec<f32> {
        let mut s = n as u64 * 1_000_003 + levels;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 33) % levels) as f32
            })
            .collect()
    }

    fn fnv(idx: &[u32]) -> u64 {
        idx.iter().fold(0xcbf2_9ce4_8422_2325, |h, &i| {
            (h ^ i as u64).wrapping_mul(0x100_0000_01b3)
        })
    }

    // FNV-1a hashes of the permutations g++ 12's libstdc++ gives for
    //   std::sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; })
    // (and std::partial_sort(idx.begin(), idx.end(), idx.end(), same) for the heap fallback).
    const SORT_GOLDEN: [(usize, u64, u64); 36] = [
        (5, 2, 0xfa1b_7603_a769_11e3),
        (5, 3, 0xe22d_2cc0_0ef0_80f5),
        (5, 7, 0x0f66_e1bf_4f6b_8607),
        (5, 1_000_000, 0xf57e_322e_1aee_4a5b),
        (16, 2, 0xb947_9b7c_7649_5873),
        (16, 3, 0xe68b_fe0f_1f11_4d17),
        (16, 7, 0xcfe5_75cb_2e6a_2b0b),
        (16, 1_000_000, 0x0d5f_715d_1053_2de3),
        (17, 2, 0xe552_8752_2f27_528d),
        (17, 3, 0x2660_80d2_416b_02d7),
        (17, 7, 0x979d_05d4_55a0_7f6b),
        (17, 1_000_000, 0x0ce4_e814_f59b_a703),
        (33, 2, 0x0335_4282_0037_dfab),
        (33, 3, 0x16a2_26a7_3bce_e0bb),
        (33, 7, 0x6434_41c0_9350_cdf3),
        (33, 1_000_000, 0x6783_d650_8688_1fc3),
        (64, 2, 0xa5c8_b40d_86a1_ca25),
        (64, 3, 0x3342_324d_af88_7c6f),
        (64, 7, 0x8eaa_239f_7b62_5e77),
        (64, 1_000_000, 0xcbbc_4fb7_6f9f_161b),
        (100, 2, 0xeca7_4a97_e325_00eb),
        (100, 3, 0xa71c_1954_ca63_db0b),
        (100, 7, 0x36ed_3d17_6035_a51b),
        (100, 1_000_000, 0x9252_9bfb_81a1_0a43),
        (128, 2, 0xa96b_3c62_5d2d_ddcd),
        (128, 3, 0x0654_ca7a_b12b_45b9),
        (128, 7, 0x292d_66ed_ce7b_5269),
        (128, 1_000_000, 0x9f5f_a7ab_f3be_c237),
        (257, 2, 0x501d_6ea0_00ce_8689),
        (257, 3, 0x10e5_6a6b_dd98_1f87),
        (257, 7, 0xd1ea_1e43_7a1d_b4bf),
        (257, 1_000_000, 0xa150_a707_585d_8575),
        (512, 2, 0x0760_0a4e_08b2_fe51),
        (512, 3, 0xc2ef_f96d_533e_b51d),
        (512, 7, 0x30df_5b93_97ea_0449),
        (512, 1_000_000, 0xa9d8_2512_1882_4e8f),
    ];
    const HEAP_GOLDEN: [(usize, u64, u64); 20] = [
        (2, 2, 0x082f_2207_b4e8_8cc4),
        (2, 3, 0x0832_8707_b4eb_6e3a),
        (2, 7, 0x0832_8707_b4eb_6e3a),
        (2, 1_000_000, 0x082f_2207_b4e8_8cc4),
        (3, 2, 0xd0a3_9918_6727_3472),
        (3, 3, 0xd0aa_6318_672c_f75e),
        (3, 7, 0xd949_aa18_6c0c_4928),
        (3, 1_000_000, 0xd949_aa18_6c0c_4928),
        (17, 2, 0x4902_a161_1020_9ef7),
        (17, 3, 0x8bba_bcd5_5229_9e2f),
        (17, 7, 0x5ee2_2098_d67b_8849),
        (17, 1_000_000, 0x0ce4_e814_f59b_a703),
        (100, 2, 0xefb8_7548_af8c_6119),
        (100, 3, 0x864b_a105_5ac1_788f),
        (100, 7, 0xed80_3e1a_801c_0329),
        (100, 1_000_000, 0x9252_9bfb_81a1_0a43),
        (257, 2, 0xcf3b_b019_3b16_472f),
        (257, 3, 0x7979_e5c9_933e_e275),
        (257, 7, 0xdfee_c6c0_76d9_c23f),
        (257, 1_000_000, 0xa150_a707_585d_8575),
    ];

    #[test]
    fn argsort_ties_match_libstdcpp() {
        for (n, levels, want) in SORT_GOLDEN {
            assert_eq!(
                fnv(&argsort_desc(&tie_values(n, levels))),
                want,
                "n={n} levels={levels}"
            );
        }
        for (n, levels, want) in HEAP_GOLDEN {
            let v = tie_values(n, levels);
            let mut idx: Vec<u32> = (0..n as u32).collect();
            heap_sort(&mut idx, 0, n, &|a: u32, b: u32| {
                v[a as usize] > v[b as usize]
            });
            assert_eq!(fnv(&idx), want, "heap n={n} levels={levels}");
        }
    }
}
