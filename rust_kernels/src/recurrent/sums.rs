//! The ordered sums the recurrent kernels share: ggml's AVX2 `ggml_vec_dot_f32` lane order and
//! its reduction, and GCC's order for in-order scalar sums (see the module notes of `recurrent`).

/// `GGML_F32x8_REDUCE` over four 8-lane accumulators stored as 32 lanes (`lanes[8 * v + l]`).
#[inline(always)]
pub(super) fn reduce32(lanes: &[f32; 32]) -> f32 {
    let x: [f32; 8] =
        std::array::from_fn(|l| (lanes[l] + lanes[16 + l]) + (lanes[8 + l] + lanes[24 + l]));
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `sum + Σ x[i]·y[i]`, added in index order, as GCC compiles ggml's scalar loops of the form
/// `sum += x[i]*y[i]` for AVX2+FMA: the products of the first `8·⌊n/8⌋` elements, and of one more
/// block of 4 when 4 to 7 remain, are rounded before they are added (vectorised products, in-order
/// adds); the last `n mod 8` (fewer than 4) or `n mod 4` are fused multiply-adds.
#[inline(always)]
pub(super) fn ordered_sum(mut sum: f32, x: &[f32], y: &[f32]) -> f32 {
    let split = fused_from(x.len());
    for (&a, &b) in x[..split].iter().zip(&y[..split]) {
        sum += a * b;
    }
    for (&a, &b) in x[split..].iter().zip(&y[split..]) {
        sum = a.mul_add(b, sum);
    }
    sum
}

/// Where `ordered_sum` switches from rounded products to FMAs for `n` terms (and the convolution
/// for `n` taps): after `8·⌊n/8⌋`, plus 4 when 4 to 7 remain.
#[inline(always)]
pub(super) fn fused_from(n: usize) -> usize {
    let n8 = n & !7;
    if n - n8 >= 4 {
        n8 + 4
    } else {
        n8
    }
}

/// `Σ x[i]·y[i]` in the order of ggml's AVX2 `ggml_vec_dot_f32` (see the module notes).
#[inline(always)]
pub(super) fn dot_lanes(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n & !31;
    let mut lanes = [0.0f32; 32];
    for (xc, yc) in x[..np].chunks_exact(32).zip(y[..np].chunks_exact(32)) {
        for l in 0..32 {
            lanes[l] = xc[l].mul_add(yc[l], lanes[l]);
        }
    }
    ordered_sum(reduce32(&lanes), &x[np..], &y[np..])
}
