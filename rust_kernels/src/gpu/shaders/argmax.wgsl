// dst[r] = the first column of row r holding the row's largest value (numpy's argmax), written as
// an f32 (exact: rows are shorter than 2^24) so that it comes back with the other f32 outputs.
// The greedy token without the logits row leaving the device. One workgroup per row; each thread
// scans a strided part of the row, then a fixed reduction tree: the same bits on every run.

struct Params {
    rows: u32,
    cols: u32,
    groups_x: u32,
    pad: u32,
}

const THREADS: u32 = 256u;
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> best_value: array<f32, THREADS>;
var<workgroup> best_index: array<u32, THREADS>;

// Whether (v, i) beats (bv, bi): larger, or as large and earlier; NONE is beaten by anything.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return i != NONE && (bi == NONE || v > bv || (v == bv && i < bi));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x + wg.y * p.groups_x;
    if r >= p.rows {
        return;
    }
    let base = r * p.cols;
    var v = 0.0;
    var i = NONE;
    // columns ascend within a thread: a strictly larger value replaces, so the first maximum stays
    for (var c = t; c < p.cols; c += THREADS) {
        let x = src[base + c];
        if i == NONE || x > v {
            v = x;
            i = c;
        }
    }
    best_value[t] = v;
    best_index[t] = i;
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s = s / 2u) {
        if t < s && beats(best_value[t + s], best_index[t + s], best_value[t], best_index[t]) {
            best_value[t] = best_value[t + s];
            best_index[t] = best_index[t + s];
        }
        workgroupBarrier();
    }
    if t == 0u {
        dst[r] = f32(best_index[0]);
    }
}
