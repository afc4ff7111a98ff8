// matmul_fast.wgsl's weights and outputs for up to four weights of one format and row length in
// one dispatch: part k reads weight binding 0, 7, 8 or 9 and writes output 5, 10, 11 or 12 (unused
// parts bind spare buffers that no workgroup touches). `part` is the same for a whole workgroup,
// so the switches never split one.

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(7) var<storage, read> w1: array<u32>;
@group(0) @binding(8) var<storage, read> w2: array<u32>;
@group(0) @binding(9) var<storage, read> w3: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(10) var<storage, read_write> y1: array<f32>;
@group(0) @binding(11) var<storage, read_write> y2: array<f32>;
@group(0) @binding(12) var<storage, read_write> y3: array<f32>;

var<private> part: u32;

fn wword(i: u32) -> u32 {
    switch part {
        case 1u: { return w1[i]; }
        case 2u: { return w2[i]; }
        case 3u: { return w3[i]; }
        default: { return w[i]; }
    }
}

fn put(i: u32, v: f32) {
    switch part {
        case 1u: { y1[i] = v; }
        case 2u: { y2[i] = v; }
        case 3u: { y3[i] = v; }
        default: { y[i] = v; }
    }
}
