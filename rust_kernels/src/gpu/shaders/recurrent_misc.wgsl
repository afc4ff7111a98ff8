// Small element-wise and per-row steps of the recurrent architectures, one entry point each:
//   gates:       dst = softplus(a + c[i % m]) * d[i % m]  (Gated DeltaNet log-decay g), dst2 = sigmoid(b)
//   sigmoid_mul: dst *= sigmoid(a)                        (the gated attention's output gate, read
//                in place: row r of m values at a[r * a_stride + a_offset ..])
//   mul_row:     dst *= a[i % m]                          (a weight over each row)
//   l2_norm:     dst = a / max(sqrt(sum a^2), eps), per row of m (ggml_l2_norm; sequential sum)
// The same formulas as the CPU path's numpy / kernel steps; no reductions across invocations.

struct Params {
    n: u32,       // elements (l2_norm: rows)
    m: u32,       // row length
    eps: f32,
    groups_x: u32,
    a_stride: u32,  // sigmoid_mul: a's row stride and first column (1 and 0 with m = 1: a as dst)
    a_offset: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<storage, read_write> dst: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst2: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> c: array<f32>;
@group(0) @binding(5) var<storage, read> d: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

fn sigmoid(v: f32) -> f32 {
    return div_rn(1.0, 1.0 + exp(-v));
}

fn index(g: vec3<u32>) -> u32 {
    return g.x + g.y * p.groups_x * 64u;
}

@compute @workgroup_size(64)
fn gates(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = index(g);
    if i >= p.n {
        return;
    }
    let v = a[i] + c[i % p.m];
    var sp = v;
    if v <= 20.0 {
        sp = log(1.0 + exp(v));
    }
    dst[i] = sp * d[i % p.m];
    dst2[i] = sigmoid(b[i]);
}

@compute @workgroup_size(64)
fn sigmoid_mul(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = index(g);
    if i >= p.n {
        return;
    }
    dst[i] = dst[i] * sigmoid(a[(i / p.m) * p.a_stride + p.a_offset + i % p.m]);
}

@compute @workgroup_size(64)
fn mul_row(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = index(g);
    if i >= p.n {
        return;
    }
    dst[i] = dst[i] * a[i % p.m];
}

@compute @workgroup_size(64)
fn l2_norm(@builtin(global_invocation_id) g: vec3<u32>) {
    let r = index(g);
    if r >= p.n {
        return;
    }
    var sum = 0.0;
    for (var i = 0u; i < p.m; i++) {
        let v = a[r * p.m + i];
        let sq = v * v;
        sum = sum + sq;
    }
    let scale = div_rn(1.0, max(sqrt_rn(sum), p.eps));
    for (var i = 0u; i < p.m; i++) {
        dst[r * p.m + i] = a[r * p.m + i] * scale;
    }
}
