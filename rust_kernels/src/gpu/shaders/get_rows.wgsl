// out[t, :] = W[ids[t], :] as f32 for the ids that fall in this binding's rows [row0, row0 + rows).
// One invocation = one token x one 32-element sub-block. Needs quant.wgsl (binding 0 = weight bytes).

override FMT: u32 = 0u;

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    n_ids: u32,
    row0: u32,
    _a: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let s = g.x;
    let t = g.y + g.z * 65535u;
    if t >= p.n_ids || 32u * s >= p.cols {
        return;
    }
    let id = u32(ids[t]);
    if id < p.row0 || id >= p.row0 + p.rows {
        return;
    }
    var wv: array<vec4<f32>, 8>;
    dequant32(FMT, (id - p.row0) * p.row_bytes, s, p.cols, &wv);
    for (var k = 0u; k < 8u; k++) {
        for (var i = 0u; i < 4u; i++) {
            let e = 32u * s + 4u * k + i;
            if e < p.cols {
                out[t * p.cols + e] = wv[k][i];
            }
        }
    }
}
