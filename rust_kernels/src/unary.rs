//! Element-wise ops that ggml's CPU backend computes with the C library's `expf`/`logf`
//! (`op_sigmoid`, `op_softplus` in ggml-cpu's unary ops), so the results here match its bits:
//! Rust's `f32::exp`/`f32::ln` call the same libm functions. numpy's own SIMD `exp` rounds
//! differently in about one value in seven.

/// ggml's sigmoid: `1 / (1 + expf(-x))`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `sigmoid` over a slice, in place.
pub fn sigmoid_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = sigmoid(*v);
    }
}

/// ggml's softplus (`x > 20 ? x : logf(1 + expf(x))`) over a slice, in place.
pub fn softplus_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = crate::recurrent::softplus(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_and_softplus_follow_their_formulas() {
        let mut s = [0.0f32, 30.0, -30.0, 1.5];
        sigmoid_inplace(&mut s);
        assert_eq!(s[0], 0.5);
        assert_eq!(s[1], 1.0);
        assert!(s[2] > 0.0 && s[2] < 1e-12);
        assert_eq!(s[3], 1.0 / (1.0 + (-1.5f32).exp()));
        let mut p = [25.0f32, 0.0, -3.0];
        softplus_inplace(&mut p);
        assert_eq!(p[0], 25.0);
        assert_eq!(p[1], 2.0f32.ln());
        assert_eq!(p[2], (1.0 + (-3.0f32).exp()).ln());
    }
}
