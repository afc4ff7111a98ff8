// GGUF weight blocks, read in place from the raw bytes of a tensor (u32 words, through `wword`:
// weight.wgsl's binding 0, or one of matmul_fast_parts.wgsl's). Library included before the
// kernels that read weights (matmul, get_rows); no entry points here.
// Layouts and formulas are ggml's (see llama.cpp ggml-quants.c, dequantize_row_*).

// ggml type ids (GgmlType in rust_kernels/src/quant/mod.rs)
const T_F32: u32 = 0u;
const T_F16: u32 = 1u;
const T_Q4_0: u32 = 2u;
const T_Q4_1: u32 = 3u;
const T_Q5_0: u32 = 6u;
const T_Q5_1: u32 = 7u;
const T_Q8_0: u32 = 8u;
const T_Q4_K: u32 = 12u;
const T_Q5_K: u32 = 13u;
const T_Q6_K: u32 = 14u;
const T_BF16: u32 = 30u;

// Bytes of one block of a quantized format (32 weights; 256 for K-quants).
fn block_bytes(fmt: u32) -> u32 {
    switch fmt {
        case T_Q4_0: { return 18u; }
        case T_Q4_1: { return 20u; }
        case T_Q5_0: { return 22u; }
        case T_Q5_1: { return 24u; }
        case T_Q8_0: { return 34u; }
        case T_Q4_K: { return 144u; }
        case T_Q5_K: { return 176u; }
        case T_Q6_K: { return 210u; }
        default: { return 0u; }
    }
}

fn byte_at(off: u32) -> u32 {
    return (wword(off >> 2u) >> ((off & 3u) * 8u)) & 0xffu;
}

// A 16-bit field at an even byte offset.
fn u16_at(off: u32) -> u32 {
    return (wword(off >> 2u) >> ((off & 2u) * 8u)) & 0xffffu;
}

fn f16_at(off: u32) -> f32 {
    return unpack2x16float(u16_at(off)).x;
}

fn i8_at(off: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(off) << 24u) >> 24u);
}

fn u32_at(off: u32) -> u32 {
    return u16_at(off) | (u16_at(off + 2u) << 16u);
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (ggml's get_scale_min_k4) from the 12 bytes at `sc`.
fn scale_min_k4(sc: u32, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(byte_at(sc + j) & 63u), f32(byte_at(sc + j + 4u) & 63u));
    }
    let d = (byte_at(sc + j + 4u) & 0xfu) | ((byte_at(sc + j - 4u) >> 6u) << 4u);
    let m = (byte_at(sc + j + 4u) >> 4u) | ((byte_at(sc + j) >> 6u) << 4u);
    return vec2<f32>(f32(d), f32(m));
}

// Four bytes at any offset as a vec4 of their unsigned values.
fn bytes4(off: u32) -> vec4<u32> {
    return vec4<u32>(byte_at(off), byte_at(off + 1u), byte_at(off + 2u), byte_at(off + 3u));
}

// Four signed bytes as f32.
fn i8x4(off: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(bytes4(off) << vec4<u32>(24u)) >> vec4<u32>(24u));
}

// Sub-block s (weights 32s .. 32s+31) of the row whose bytes start at `row`: writes the integer
// quants (or, for float formats, the values) to `q`, four per vec4, and returns (scale, min) such
// that weight = scale * q - min. Legacy blocks are 32 long; K-quant blocks hold 8 sub-blocks.
// Float values past `cols` read as zero. Every loop runs a constant 8 times, so compilers unroll
// it and `q` stays in registers.
fn load32(fmt: u32, row: u32, s: u32, cols: u32, q: ptr<function, array<vec4<f32>, 8>>) -> vec2<f32> {
    switch fmt {
        case T_F32, T_F16, T_BF16: {
            for (var k = 0u; k < 8u; k++) {
                var v = vec4<f32>(0.0);
                for (var i = 0u; i < 4u; i++) {
                    let e = 32u * s + 4u * k + i;
                    if e < cols {
                        if fmt == T_F32 {
                            v[i] = bitcast<f32>(wword((row >> 2u) + e));
                        } else if fmt == T_F16 {
                            v[i] = f16_at(row + 2u * e);
                        } else {
                            v[i] = bitcast<f32>(u16_at(row + 2u * e) << 16u);
                        }
                    }
                }
                (*q)[k] = v;
            }
            return vec2<f32>(1.0, 0.0);
        }
        case T_Q4_0, T_Q4_1: {
            // d, (m,) qs[16]: low nibbles are weights 0..15, high nibbles 16..31
            let size = block_bytes(fmt);
            let b = row + size * s;
            let qs = b + size - 16u;
            let off = select(vec4<f32>(8.0), vec4<f32>(0.0), fmt == T_Q4_1);
            for (var k = 0u; k < 4u; k++) {
                let v = bytes4(qs + 4u * k);
                (*q)[k] = vec4<f32>(v & vec4<u32>(0xfu)) - off;
                (*q)[k + 4u] = vec4<f32>(v >> vec4<u32>(4u)) - off;
            }
            if fmt == T_Q4_1 {
                return vec2<f32>(f16_at(b), -f16_at(b + 2u));
            }
            return vec2<f32>(f16_at(b), 0.0);
        }
        case T_Q5_0, T_Q5_1: {
            // d, (m,) qh (32 fifth bits), qs[16]
            let size = block_bytes(fmt);
            let b = row + size * s;
            let qh = u32_at(b + size - 20u);
            let qs = b + size - 16u;
            let off = select(vec4<f32>(16.0), vec4<f32>(0.0), fmt == T_Q5_1);
            for (var k = 0u; k < 4u; k++) {
                let v = bytes4(qs + 4u * k);
                let j = vec4<u32>(4u * k) + vec4<u32>(0u, 1u, 2u, 3u);
                let h0 = ((vec4<u32>(qh) >> j) << vec4<u32>(4u)) & vec4<u32>(0x10u);
                let h1 = (vec4<u32>(qh) >> (j + vec4<u32>(12u))) & vec4<u32>(0x10u);
                (*q)[k] = vec4<f32>((v & vec4<u32>(0xfu)) | h0) - off;
                (*q)[k + 4u] = vec4<f32>((v >> vec4<u32>(4u)) | h1) - off;
            }
            if fmt == T_Q5_1 {
                return vec2<f32>(f16_at(b), -f16_at(b + 2u));
            }
            return vec2<f32>(f16_at(b), 0.0);
        }
        case T_Q8_0: {
            let b = row + block_bytes(fmt) * s;
            for (var k = 0u; k < 8u; k++) {
                (*q)[k] = i8x4(b + 2u + 4u * k);
            }
            return vec2<f32>(f16_at(b), 0.0);
        }
        case T_Q4_K, T_Q5_K: {
            // Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same, then qh[32] before qs. Sub-block
            // j uses nibbles of qs[32*(j/2) ..], low for even j; bit j of qh[l] is Q5_K's fifth bit.
            let size = block_bytes(fmt);
            let b = row + size * (s / 8u);
            let j = s % 8u;
            let shift = vec4<u32>(4u * (j % 2u));
            let qs = b + size - 128u + 32u * (j / 2u);
            for (var k = 0u; k < 8u; k++) {
                var v = (bytes4(qs + 4u * k) >> shift) & vec4<u32>(0xfu);
                if fmt == T_Q5_K {
                    v |= ((bytes4(b + 16u + 4u * k) >> vec4<u32>(j)) & vec4<u32>(1u)) << vec4<u32>(4u);
                }
                (*q)[k] = vec4<f32>(v);
            }
            let sm = scale_min_k4(b + 4u, j);
            return vec2<f32>(f16_at(b) * sm.x, f16_at(b + 2u) * sm.y);
        }
        case T_Q6_K: {
            // ql[128], qh[64], scales[16] (i8), d; halves of 128, each four runs of 32. The i8
            // scales (one per 16 weights) come from q6k_scales: the returned scale is d alone.
            let b = row + block_bytes(fmt) * (s / 8u);
            let half = (s % 8u) / 4u;
            let part = s % 4u;
            let ql = b + 64u * half + 32u * (part % 2u);
            let qh = b + 128u + 32u * half;
            let lo_shift = vec4<u32>(4u * (part / 2u));
            for (var k = 0u; k < 8u; k++) {
                let lo = (bytes4(ql + 4u * k) >> lo_shift) & vec4<u32>(0xfu);
                let hi = ((bytes4(qh + 4u * k) >> vec4<u32>(2u * part)) & vec4<u32>(3u)) << vec4<u32>(4u);
                (*q)[k] = vec4<f32>(lo | hi) - vec4<f32>(32.0);
            }
            return vec2<f32>(f16_at(b + 208u), 0.0);
        }
        default: {
            for (var k = 0u; k < 8u; k++) {
                (*q)[k] = vec4<f32>(0.0);
            }
            return vec2<f32>(0.0, 0.0);
        }
    }
}

// Q6_K keeps one i8 scale per 16 weights: those of sub-block s (first and second 16).
fn q6k_scales(row: u32, s: u32) -> vec2<f32> {
    let b = row + block_bytes(T_Q6_K) * (s / 8u);
    let half = (s % 8u) / 4u;
    let part = s % 4u;
    let sc = b + 192u + 8u * half + 2u * part;
    return vec2<f32>(i8_at(sc), i8_at(sc + 1u));
}

// Weights 32s .. 32s+31 as f32 values, four per vec4.
fn dequant32(fmt: u32, row: u32, s: u32, cols: u32, out: ptr<function, array<vec4<f32>, 8>>) {
    let sm = load32(fmt, row, s, cols, out);
    var sc = vec2<f32>(1.0, 1.0);
    if fmt == T_Q6_K {
        sc = q6k_scales(row, s);
    }
    for (var k = 0u; k < 8u; k++) {
        (*out)[k] = sm.x * select(sc.x, sc.y, k >= 4u) * (*out)[k] - sm.y;
    }
}

// The integer quants of elements e..e+3 (e a multiple of 4) of the row at `row`, as the CPU's dot
// products take them: legacy formats with their offset applied (Q4_0: -8, Q5_0: -16), Q4_K/Q5_K
// unsigned, Q6_K unsigned 0..63 (the -32 enters through the activation sums).
fn quad_q(fmt: u32, row: u32, e: u32) -> vec4<i32> {
    switch fmt {
        case T_Q8_0: {
            return vec4<i32>(i8x4(row + block_bytes(fmt) * (e / 32u) + 2u + e % 32u));
        }
        case T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1: {
            let size = block_bytes(fmt);
            let b = row + size * (e / 32u);
            let j = e % 32u;
            var v = (bytes4(b + size - 16u + j % 16u) >> vec4<u32>(4u * (j / 16u))) & vec4<u32>(0xfu);
            if fmt == T_Q5_0 || fmt == T_Q5_1 {
                let qh = u32_at(b + size - 20u);
                v |= ((vec4<u32>(qh) >> (vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u);
            }
            let off = select(select(8, 16, fmt == T_Q5_0), 0, fmt == T_Q4_1 || fmt == T_Q5_1);
            return vec4<i32>(v) - vec4<i32>(off);
        }
        case T_Q4_K, T_Q5_K: {
            let size = block_bytes(fmt);
            let b = row + size * (e / 256u);
            let c = (e % 256u) / 32u;
            let l = e % 32u;
            var v = (bytes4(b + size - 128u + 32u * (c / 2u) + l) >> vec4<u32>(4u * (c % 2u))) & vec4<u32>(0xfu);
            if fmt == T_Q5_K {
                v |= ((bytes4(b + 16u + l) >> vec4<u32>(c)) & vec4<u32>(1u)) << vec4<u32>(4u);
            }
            return vec4<i32>(v);
        }
        case T_Q6_K: {
            let b = row + block_bytes(fmt) * (e / 256u);
            let r = e % 256u;
            let half = r / 128u;
            let part = (r % 128u) / 32u;
            let l = r % 32u;
            let lo = (bytes4(b + 64u * half + 32u * (part % 2u) + l) >> vec4<u32>(4u * (part / 2u))) & vec4<u32>(0xfu);
            let hi = ((bytes4(b + 128u + 32u * half + l) >> vec4<u32>(2u * part)) & vec4<u32>(3u)) << vec4<u32>(4u);
            return vec4<i32>(lo | hi);
        }
        default: {
            return vec4<i32>(0);
        }
    }
}

// Elements e..e+3 of a float row (F32, F16, BF16), zero past `cols`.
fn quad_f(fmt: u32, row: u32, e: u32, cols: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if e + i < cols {
            if fmt == T_F32 {
                v[i] = bitcast<f32>(wword((row >> 2u) + e + i));
            } else if fmt == T_F16 {
                v[i] = f16_at(row + 2u * (e + i));
            } else {
                v[i] = bitcast<f32>(u16_at(row + 2u * (e + i)) << 16u);
            }
        }
    }
    return v;
}
