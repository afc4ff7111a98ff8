// RMSNorm of each row of n elements, times a weight of length n (or not):
// y = x * (1 / sqrt(mean(x^2) + eps)) * w. One workgroup per row; a fixed tree sums the squares.

struct Params {
    n: u32,
    rows: u32,
    eps: f32,
    has_weight: u32,
    groups_x: u32,
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * p.groups_x;
    var sum = 0.0;
    if row < p.rows {
        for (var i = lid; i < p.n; i += 64u) {
            let v = x[row * p.n + i];
            sum = fma(v, v, sum);
        }
    }
    partial[lid] = sum;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    if row >= p.rows {
        return;
    }
    let scale = 1.0 / sqrt(partial[0] / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += 64u) {
        var v = x[row * p.n + i] * scale;
        if p.has_weight != 0u {
            v *= weight[i];
        }
        y[row * p.n + i] = v;
    }
}
