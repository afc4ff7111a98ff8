// f64 arithmetic in integers, for the CPU kernels' f64 sums of non-negative f32 values (WGSL has
// no f64): the MoE softmax and renormalisation sums (moe.wgsl) and the attention softmax's sum
// (attention.wgsl), each rounded as the CPU rounds it, and `recip_f32`, the f32 nearest to 1/sum
// as the CPU computes it (f32 quotients and roots: math.wgsl). A value is m * 2^e, m a 53-bit
// integer (bit 52 set) or 0; m as (lo, hi). In fast numerics the same interface holds an f32 sum.

//#if exact
struct F64 {
    m: vec2<u32>,
    e: i32,
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x >= b.x);
}

fn shl64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    if s >= 32u {
        return vec2<u32>(0u, a.x << (s - 32u));
    }
    return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}

// a >> s, with bit 0 set when a nonzero bit was shifted out (the sticky bit)
fn shr64_sticky(a: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    var r: vec2<u32>;
    var lost: bool;
    if s >= 64u {
        r = vec2<u32>(0u);
        lost = a.x != 0u || a.y != 0u;
    } else if s >= 32u {
        r = vec2<u32>(a.y >> (s - 32u), 0u);
        lost = a.x != 0u || (s > 32u && (a.y << (64u - s)) != 0u);
    } else {
        r = vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
        lost = (a.x << (32u - s)) != 0u;
    }
    if lost {
        r.x |= 1u;
    }
    return r;
}

fn bit_length(a: vec2<u32>) -> u32 {
    if a.y != 0u {
        return 64u - countLeadingZeros(a.y);
    }
    return 32u - countLeadingZeros(a.x);
}

// a / 2^s rounded to nearest, ties to even; `sticky`: a nonzero value lies below a's last bit
fn round_shift(a: vec2<u32>, s: u32, sticky: bool) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    var r = floor_shr64(a, s);
    let dropped = sub64(a, shl64(r, s));
    let half = shl64(vec2<u32>(1u, 0u), s - 1u);
    let at_half = dropped.x == half.x && dropped.y == half.y;
    let above = !ge64(half, dropped) || (at_half && sticky);
    if above || (at_half && !sticky && (r.x & 1u) == 1u) {
        r = add64(r, vec2<u32>(1u, 0u));
    }
    return r;
}

fn floor_shr64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return a;
    }
    if s >= 64u {
        return vec2<u32>(0u);
    }
    if s >= 32u {
        return vec2<u32>(a.y >> (s - 32u), 0u);
    }
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

// m (any width, nonzero) * 2^e with `sticky` below it, rounded to 53 bits
fn normalize(m: vec2<u32>, e: i32, sticky: bool) -> F64 {
    if m.x == 0u && m.y == 0u {
        return F64(m, 0);
    }
    let n = bit_length(m);
    if n <= 53u {
        return F64(shl64(m, 53u - n), e - i32(53u - n));
    }
    var r = round_shift(m, n - 53u, sticky);
    var e2 = e + i32(n - 53u);
    if bit_length(r) > 53u {
        r = floor_shr64(r, 1u);  // 2^53: the dropped bit is 0
        e2 += 1;
    }
    return F64(r, e2);
}

fn f64_of(v: f32) -> F64 {
    let b = bitcast<u32>(v);
    let ex = (b >> 23u) & 0xffu;
    var m = b & 0x7fffffu;
    var e = -149;
    if ex != 0u {
        m |= 0x800000u;
        e = i32(ex) - 150;
    }
    return normalize(vec2<u32>(m, 0u), e, false);
}

fn f64_zero() -> F64 {
    return F64(vec2<u32>(0u), 0);
}

fn is_zero(a: F64) -> bool {
    return a.m.x == 0u && a.m.y == 0u;
}

// a + b, both >= 0, rounded to f64 (round to nearest even)
fn f64_add(a0: F64, b0: F64) -> F64 {
    if is_zero(b0) {
        return a0;
    }
    if is_zero(a0) {
        return b0;
    }
    var a = a0;
    var b = b0;
    if b.e > a.e {
        a = b0;
        b = a0;
    }
    let d = u32(a.e - b.e);
    if d >= 55u {
        return a;  // b < half an ulp of a
    }
    // three guard bits; bit 0 is the sticky bit of what shifted out of b (a's low bits are 0)
    let sum = add64(shl64(a.m, 3u), shr64_sticky(shl64(b.m, 3u), d));
    return normalize(sum, a.e - 3, false);
}

// a (normal range) rounded to the nearest f32
fn f32_of(a: F64) -> f32 {
    if is_zero(a) {
        return 0.0;
    }
    let r = normalize(a.m, a.e, false);
    var m = round_shift(r.m, 29u, false);
    var e = r.e + 29;
    if m.x >= 0x1000000u {
        m = floor_shr64(m, 1u);
        e += 1;
    }
    // m in [2^23, 2^24): the value m * 2^e; exponent field e + 23 + 127
    return bitcast<f32>((u32(e + 150) << 23u) | (m.x & 0x7fffffu));
}

// f32(1 / a) through the f64 quotient, as `(1.0 / sum) as f32` on the CPU
fn recip_f32(a: F64) -> f32 {
    // N = floor(2^108 / m) by long division, m in [2^52, 2^53): N has 56 or 57 bits
    let m = a.m;
    var r = vec2<u32>(1u, 0u);
    var q = vec2<u32>(0u);
    for (var i = 0u; i < 108u; i++) {
        r = shl64(r, 1u);
        q = shl64(q, 1u);
        if ge64(r, m) {
            r = sub64(r, m);
            q.x |= 1u;
        }
    }
    let f = normalize(q, -108 - a.e, r.x != 0u || r.y != 0u);
    return f32_of(f);
}
//#else
// Fast numerics: the same sums in the same order, accumulated in f32 by the adapter.
struct F64 {
    s: f32,
}

fn f64_zero() -> F64 {
    return F64(0.0);
}

fn f64_of(v: f32) -> F64 {
    return F64(v);
}

fn f64_add(a: F64, b: F64) -> F64 {
    return F64(a.s + b.s);
}

fn f32_of(a: F64) -> f32 {
    return a.s;
}

fn recip_f32(a: F64) -> f32 {
    return 1.0 / a.s;
}
//#endif
