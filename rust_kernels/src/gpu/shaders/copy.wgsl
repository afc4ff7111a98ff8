// dst[r, dst_col0 + c] = src[src_row(r), src_col0 + c] for c < cols: gathers rows (src_row = ids[r]
// when use_ids, else r) and cuts or places column ranges.

struct Params {
    rows: u32,
    cols: u32,
    src_stride: u32,
    src_col0: u32,
    dst_stride: u32,
    dst_col0: u32,
    use_ids: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x + g.y * p.groups_x * 64u;
    if i >= p.rows * p.cols {
        return;
    }
    let r = i / p.cols;
    let c = i % p.cols;
    var sr = r;
    if p.use_ids != 0u {
        sr = u32(ids[r]);
    }
    dst[r * p.dst_stride + p.dst_col0 + c] = src[sr * p.src_stride + p.src_col0 + c];
}
