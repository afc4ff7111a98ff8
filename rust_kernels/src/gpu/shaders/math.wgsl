// Scalar helpers shared by several kernels; they reproduce the CPU kernels' float operations.

fn to_f16(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}

// ggml's vectorised expf (ggml_v_expf), the one the CPU softmax and SiLU use: same constants,
// same fused operations. ggml rounds x·log2(e) with the 1.5·2^23 addition trick; shader compilers
// may fold `(a + r) - r` to `a`, so the rounding is spelled out (round half to even, as the trick).
fn expf_ggml(x: f32) -> f32 {
    let n = round(x * bitcast<f32>(0x3fb8aa3bu));
    let b = fma(-n, bitcast<f32>(0x35bfbe8eu), fma(-n, bitcast<f32>(0x3f317200u), x));
    let e = bitcast<u32>(i32(n)) << 23u;
    let k = bitcast<f32>(e + 0x3f800000u);
    let u = b * b;
    let j = fma(
        fma(fma(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
            fma(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))),
        u,
        bitcast<f32>(0x3f7ffff6u) * b);
    if abs(n) <= 126.0 {
        return fma(j, k, k);
    }
    let g = select(0u, 0x82000000u, n <= 0.0);
    let s1 = bitcast<f32>(g + 0x7f000000u);
    let s2 = bitcast<f32>(e - g);
    if abs(n) > 192.0 {
        return s1 * s1;
    }
    return fma(s2, j, s2) * s1;
}
