// Scalar helpers shared by several kernels. Two numerics modes, chosen when the device opens:
// - `exact` (`//#if exact`): each helper reproduces the CPU kernels' float operation bit for bit,
//   in integers where WGSL leaves the rounding to the adapter;
// - fast (the `//#else` branches): the adapter's own `fma`, `/`, `sqrt`, `exp` and f16 packing.
//   Still deterministic and batch-invariant: every kernel keeps its fixed order of operations, so
//   a row's bits depend only on its inputs, never on its batch, its chunking or the run.

// 1 where the adapter's `fma` is fused (one rounding), as the CPU's is; 0 where it rounds the
// product first (Mesa's lavapipe does): then `fma_exact` computes the fused result in integers.
// The device probes this once when it opens.
override FUSED_FMA: u32 = 1u;

// Unsigned 64-bit integers as vec2<u32>(high word, low word).
fn u64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.y + b.y;
    return vec2<u32>(a.x + b.x + select(0u, 1u, lo < a.y), lo);
}

fn u64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x - select(0u, 1u, a.y < b.y), a.y - b.y);
}

fn u64_less(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

fn u64_clz(a: vec2<u32>) -> u32 {
    return select(32u + countLeadingZeros(a.y), countLeadingZeros(a.x), a.x != 0u);
}

fn u64_shl(a: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    if s >= 64u {
        return vec2<u32>(0u, 0u);
    }
    if s >= 32u {
        return vec2<u32>(a.y << (s - 32u), 0u);
    }
    return vec2<u32>((a.x << s) | (a.y >> (32u - s)), a.y << s);
}

// a >> s, truncating
fn u64_shr(a: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    if s >= 64u {
        return vec2<u32>(0u, 0u);
    }
    if s >= 32u {
        return vec2<u32>(0u, a.x >> (s - 32u));
    }
    return vec2<u32>(a.x >> s, (a.y >> s) | (a.x << (32u - s)));
}

// a >> s with every bit shifted out OR-ed into bit 0 (the sticky bit of IEEE rounding)
fn u64_shr_sticky(a: vec2<u32>, s: u32) -> vec2<u32> {
    var r = u64_shr(a, s);
    if any(u64_shl(r, s) != a) {
        r.y |= 1u;
    }
    return r;
}

// |v| = mant * 2^exp for a finite f32 (mant < 2^24; subnormals keep exponent -149)
struct Unpacked {
    mant: u32,
    exp: i32,
    neg: bool,
}

fn unpack_f32(v: f32) -> Unpacked {
    let bits = bitcast<u32>(v);
    let e = (bits >> 23u) & 0xffu;
    let m = bits & 0x7fffffu;
    if e == 0u {
        return Unpacked(m, -149, (bits >> 31u) != 0u);
    }
    return Unpacked(m | 0x800000u, i32(e) - 150, (bits >> 31u) != 0u);
}

// The f32 nearest to (-1)^neg * s * 2^e (ties to even), subnormals and overflow included.
fn round_to_f32(s: vec2<u32>, e: i32, neg: bool) -> f32 {
    let sign = select(0u, 0x80000000u, neg);
    if all(s == vec2<u32>(0u, 0u)) {
        return bitcast<f32>(sign);
    }
    let top = 63 - i32(u64_clz(s));
    // keep 24 bits, or fewer where the result is subnormal (biased exponent e + k + 150 >= 1)
    let k = max(top - 23, -149 - e);
    var q: u32;
    var ex = e + k;
    if k <= 0 {
        q = u64_shl(s, u32(-k)).y;
    } else if k >= 64 {
        return bitcast<f32>(sign);
    } else {
        let t = u64_shr(s, u32(k));
        let rem = u64_sub(s, u64_shl(t, u32(k)));
        let half = u64_shl(vec2<u32>(0u, 1u), u32(k - 1));
        q = t.y;
        if u64_less(half, rem) || (all(rem == half) && (q & 1u) == 1u) {
            q += 1u;
        }
        if q == 0x1000000u {
            q = 0x800000u;
            ex += 1;
        }
    }
    if q < 0x800000u {
        return bitcast<f32>(sign | q);  // subnormal (or the rounding made it the least normal)
    }
    let biased = ex + 150;
    if biased >= 255 {
        return bitcast<f32>(sign | 0x7f800000u);
    }
    return bitcast<f32>(sign | (u32(biased) << 23u) | (q & 0x7fffffu));
}

// a * b + c rounded once, computed in integers (exact on any adapter).
fn fma_soft(a: f32, b: f32, c: f32) -> f32 {
    let ua = unpack_f32(a);
    let ub = unpack_f32(b);
    let uc = unpack_f32(c);
    let special = ((bitcast<u32>(a) >> 23u) & 0xffu) == 0xffu || ((bitcast<u32>(b) >> 23u) & 0xffu) == 0xffu
        || ((bitcast<u32>(c) >> 23u) & 0xffu) == 0xffu;
    if special || ua.mant == 0u || ub.mant == 0u {
        return a * b + c;  // inf/NaN, or a zero product: one rounding at most
    }
    // the 48-bit product from 12-bit halves
    let ah = ua.mant >> 12u;
    let al = ua.mant & 0xfffu;
    let bh = ub.mant >> 12u;
    let bl = ub.mant & 0xfffu;
    let hh = ah * bh;
    let mid = ah * bl + al * bh;
    var p = u64_add(vec2<u32>(hh >> 8u, hh << 24u), vec2<u32>(mid >> 20u, mid << 12u));
    p = u64_add(p, vec2<u32>(0u, al * bl));
    if uc.mant == 0u {
        return round_to_f32(p, ua.exp + ub.exp, ua.neg != ub.neg);
    }
    // both operands with their top bit at 61 (two bits of headroom for the carry)
    let sp = u64_clz(p) - 2u;
    var x = u64_shl(p, sp);
    var ex = ua.exp + ub.exp - i32(sp);
    var nx = ua.neg != ub.neg;
    let sc = u64_clz(vec2<u32>(0u, uc.mant)) - 2u;
    var y = u64_shl(vec2<u32>(0u, uc.mant), sc);
    var ey = uc.exp - i32(sc);
    var ny = uc.neg;
    if ey > ex {
        let t = x;
        x = y;
        y = t;
        let te = ex;
        ex = ey;
        ey = te;
        let tn = nx;
        nx = ny;
        ny = tn;
    }
    // x's low bits are zero, so the sticky bit keeps every rounding decision of the exact sum
    y = u64_shr_sticky(y, u32(min(ex - ey, 64)));
    if nx == ny {
        return round_to_f32(u64_add(x, y), ex, nx);
    }
    if u64_less(x, y) {
        return round_to_f32(u64_sub(y, x), ex, ny);
    }
    let d = u64_sub(x, y);
    return round_to_f32(d, ex, nx && any(d != vec2<u32>(0u, 0u)));
}

// The CPU's fused multiply-add, bit for bit on every adapter.
fn fma_exact(a: f32, b: f32, c: f32) -> f32 {
//#if exact
    if FUSED_FMA != 0u {
        return fma(a, b, c);
    }
    return fma_soft(a, b, c);
//#else
    return fma(a, b, c);
//#endif
}

// ---- Correctly rounded division, square root and f32 -> f16 conversion, in integers -----------
// WGSL lets `/` be 2.5 ulp off and `sqrt` a few ulp, and leaves the rounding of f32 -> f16
// conversions to the implementation; software rasterisers round correctly, real GPUs use the
// freedom (an NVIDIA H100 under Vulkan: approximate quotients, f16 packing towards zero, which
// moved activation quantization and the f16 KV cache off the CPU's results). The CPU kernels
// round each of these to nearest even, so these helpers do too, on any adapter.

fn finite_nonzero(v: f32) -> bool {
    let a = bitcast<u32>(v) & 0x7fffffffu;
    return a != 0u && a < 0x7f800000u;
}

// |v| = mant * 2^exp with mant in [2^23, 2^24), subnormals normalised; v finite and nonzero
fn unpack_normalised(v: f32) -> Unpacked {
    var u = unpack_f32(v);
    let shift = countLeadingZeros(u.mant) - 8u;
    u.mant = u.mant << shift;
    u.exp -= i32(shift);
    return u;
}

// a / b rounded to nearest even (zeros, infinities and NaN: WGSL's `/`, exact for those)
fn div_rn(a: f32, b: f32) -> f32 {
//#if exact
    if !finite_nonzero(a) || !finite_nonzero(b) {
        return a / b;
    }
    let x = unpack_normalised(a);
    let y = unpack_normalised(b);
    var r = x.mant;
    var e = x.exp - y.exp;
    if r < y.mant {
        r = r << 1u;
        e -= 1;
    }
    // 26 bits of the mantissas' quotient (in [1, 2)) by long division, then a sticky bit
    var q = 0u;
    for (var i = 0u; i < 26u; i++) {
        q = q << 1u;
        if r >= y.mant {
            r -= y.mant;
            q |= 1u;
        }
        r = r << 1u;
    }
    q = (q << 1u) | select(0u, 1u, r != 0u);
    return round_to_f32(vec2<u32>(0u, q), e - 26, x.neg != y.neg);
//#else
    return a / b;
//#endif
}

// sqrt(v) rounded to nearest even (v <= 0, infinities and NaN: WGSL's `sqrt`)
fn sqrt_rn(v: f32) -> f32 {
//#if exact
    if !(v > 0.0) || !finite_nonzero(v) {
        return sqrt(v);
    }
    let x = unpack_normalised(v);
    var m = vec2<u32>(0u, x.mant);
    var e = x.exp;
    if (e & 1) != 0 {
        m = u64_shl(m, 1u);
        e -= 1;
    }
    // digit-by-digit square root of n = m * 2^26 (< 2^51): 26 root bits (>= 25 significant)
    let n = u64_shl(m, 26u);
    var rem = 0u;
    var root = 0u;
    for (var i = 0u; i < 26u; i++) {
        rem = (rem << 2u) | (u64_shr(n, 50u - 2u * i).y & 3u);
        let trial = (root << 2u) | 1u;
        root = root << 1u;
        if rem >= trial {
            rem -= trial;
            root |= 1u;
        }
    }
    let s = (root << 1u) | select(0u, 1u, rem != 0u);
    return round_to_f32(vec2<u32>(0u, s), (e - 26) / 2 - 1, false);
//#else
    return sqrt(v);
//#endif
}

// The bits of the f16 nearest to v (ties to even, overflow to infinity, f16 subnormals kept): the
// hardware's conversion where the adapter has shader-f16 and it passed its probe (features.rs),
// else in integers.
fn f16_bits(v: f32) -> u32 {
//#if f16
    // the rounding is f16(v); packing a value that is already an f16 is exact
    return pack2x16float(vec2<f32>(f32(f16(v)), 0.0)) & 0xffffu;
//#else
//#if exact
    return f16_bits_soft(v);
//#else
    return pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;
//#endif
//#endif
}

fn f16_bits_soft(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);  // NaN stays NaN
    }
    if a >= 0x477ff000u {
        return sign | 0x7c00u;  // >= 65520 (infinity included) rounds to infinity
    }
    if a >= 0x38800000u {
        // normal f16: rebias the exponent (127 - 15), round 13 mantissa bits away
        let r = a - 0x38000000u;
        let low = r & 0x1fffu;
        var h = r >> 13u;
        if low > 0x1000u || (low == 0x1000u && (h & 1u) == 1u) {
            h += 1u;
        }
        return sign | h;
    }
    // f16 subnormal or zero: units of 2^-24
    let e = a >> 23u;
    let shift = 126u - e;
    if e == 0u || shift >= 26u {
        return sign;
    }
    let m = (a & 0x7fffffu) | 0x800000u;
    var q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    if rem > half || (rem == half && (q & 1u) == 1u) {
        q += 1u;
    }
    return sign | q;
}

fn pack_f16x2(a: f32, b: f32) -> u32 {
    return f16_bits(a) | (f16_bits(b) << 16u);
}

fn to_f16(v: f32) -> f32 {
    return unpack2x16float(f16_bits(v)).x;
}

// a * b rounded once, in integers (`fma_soft` with -0 added: the product's own sign survives)
fn mul_soft(a: f32, b: f32) -> f32 {
//#if exact
    return fma_soft(a, b, -0.0);
//#else
    return a * b;
//#endif
}

// ggml's vectorised expf (ggml_v_expf), the one the CPU softmax and SiLU use: same constants,
// same operations, each rounded once as the CPU's and computed in integers (`fma_soft`,
// `mul_soft`), whatever FUSED_FMA says. SPIR-V without NoContraction lets a driver split an `fma`
// or fuse a product into the add it feeds, and results computed in integers leave it nothing to
// rearrange: an NVIDIA H200 under Vulkan (fused `fma` by the device's probe) gave SiLU 1-2 ulps
// off the CPU on 0.7% of inputs with the hardware `fma` here. x·log2(e) is rounded to an integer
// as ggml does, by adding 1.5·2^23 in the fused step and subtracting it again.
fn expf_ggml(x: f32) -> f32 {
//#if exact
    let r = bitcast<f32>(0x4b400000u);
    let z = fma_soft(x, bitcast<f32>(0x3fb8aa3bu), r);
    let n = z - r;
    let b = fma_soft(-n, bitcast<f32>(0x35bfbe8eu), fma_soft(-n, bitcast<f32>(0x3f317200u), x));
    let e = bitcast<u32>(z) << 23u;
    let k = bitcast<f32>(e + 0x3f800000u);
    let u = mul_soft(b, b);
    let j = fma_soft(
        fma_soft(fma_soft(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
            fma_soft(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))),
        u,
        mul_soft(bitcast<f32>(0x3f7ffff6u), b));
    if abs(n) <= 126.0 {
        return fma_soft(j, k, k);
    }
    let g = select(0u, 0x82000000u, n <= 0.0);
    let s1 = bitcast<f32>(g + 0x7f000000u);
    let s2 = bitcast<f32>(e - g);
    if abs(n) > 192.0 {
        return mul_soft(s1, s1);
    }
    return mul_soft(fma_soft(s2, j, s2), s1);
//#else
    return exp(x);
//#endif
}
