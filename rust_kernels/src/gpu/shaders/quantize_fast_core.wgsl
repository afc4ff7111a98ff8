// Fast numerics: activations quantized as quantize_act.wgsl quantizes them for the quantized
// formats' dot products (ACT 3 = Q8_0, 4 = Q8_1, 5 = Q8_K; same outputs, same formulas), 256
// values of a row at a time by a workgroup of 64 threads of 4 values each, so that a decode step's
// few blocks do not run on a handful of threads. Used by quantize_fast.wgsl (a workgroup per 256
// values) and by norm_quantize_end.wgsl (an RMSNorm's workgroup quantizes the row it normalised).
// What quantize_act computes in order is order-free here: the largest magnitude (the first one for
// Q8_K's signed max: a tree that takes the later half only where it is strictly larger) and the
// integer sums of the quants (exact in f32). One call's result depends on its 256 values alone.
// The includer provides `act_in(at)`, the value at `at` of the row-major input. Needs math.wgsl
// (div_rn, to_f16).

override ACT: u32 = 5u;

@group(0) @binding(5) var<storage, read_write> xq: array<f32>;  // n x n_sub*32
@group(0) @binding(6) var<storage, read_write> xd: array<f32>;  // n x n_sub
@group(0) @binding(7) var<storage, read_write> xs: array<f32>;  // n x n_sub
@group(0) @binding(8) var<storage, read_write> xh: array<f32>;  // n x n_sub

var<workgroup> mag: array<f32, 64>;   // largest magnitude so far
var<workgroup> val: array<f32, 64>;   // Q8_K: the signed value that has it
var<workgroup> sums: array<f32, 64>;  // each thread's sum of its four quants

// Quantizes values 256 * chunk .. of row `row` (of `cols` values, `n_sub` sub-blocks of 32).
// Every thread of the workgroup calls it (it has barriers).
fn quantize_256(row: u32, chunk: u32, n_sub: u32, cols: u32, lid: u32) {
    let s = chunk * 8u + lid / 8u;  // this thread's sub-block
    let live = s < n_sub;
    let e0 = 32u * s + 4u * (lid % 8u);
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if live && e0 + i < cols {
            v[i] = act_in(row * cols + e0 + i);
        }
    }
    // the first value of the largest magnitude among this thread's four
    var amax = 0.0;
    var mx = 0.0;
    for (var i = 0u; i < 4u; i++) {
        if abs(v[i]) > amax {
            amax = abs(v[i]);
            mx = v[i];
        }
    }
    mag[lid] = amax;
    val[lid] = mx;
    // Q8_K: over the 64 threads (256 values); Q8_0 / Q8_1: over a sub-block's 8 threads. Pairs of
    // neighbouring runs, so that the earlier run is always the one kept on a tie.
    let span = select(8u, 64u, ACT == 5u);
    for (var h = 1u; h < span; h = h << 1u) {
        workgroupBarrier();
        if lid % (2u * h) == 0u && mag[lid + h] > mag[lid] {
            mag[lid] = mag[lid + h];
            val[lid] = val[lid + h];
        }
    }
    workgroupBarrier();
    let first = lid - lid % span;
    var q = vec4<f32>(0.0);
    var d = 0.0;
    if ACT == 5u {
        amax = mag[first];
        mx = val[first];
        var iscale = 0.0;
        if amax != 0.0 {
            iscale = div_rn(-127.0, mx);
            d = div_rn(1.0, iscale);
        }
        q = min(vec4<f32>(127.0), round(iscale * v));
    } else {
        amax = mag[first];
        d = div_rn(amax, 127.0);
        let id = select(0.0, div_rn(127.0, amax), amax != 0.0);
        q = round(v * id);
    }
    sums[lid] = (q.x + q.y) + (q.z + q.w);
    workgroupBarrier();
    if live {
        write_quants(row * n_sub + s, lid, q, d);
    }
    workgroupBarrier();  // the next call reuses the workgroup's arrays
}

// One thread's four quants; the sub-block's first thread also writes its scale and sums.
fn write_quants(base: u32, lid: u32, q: vec4<f32>, d: f32) {
    for (var i = 0u; i < 4u; i++) {
        xq[32u * base + 4u * (lid % 8u) + i] = q[i];
    }
    if lid % 8u == 0u {
        // the quants' sums are integers below 2^24: exact in any order
        let lo = (sums[lid] + sums[lid + 1u]) + (sums[lid + 2u] + sums[lid + 3u]);
        let hi = (sums[lid + 4u] + sums[lid + 5u]) + (sums[lid + 6u] + sums[lid + 7u]);
        if ACT == 5u {
            xd[base] = d;
            xs[base] = lo;
            xh[base] = hi;
        } else {
            xd[base] = to_f16(d);
            xs[base] = select(to_f16(d) * (lo + hi), to_f16(d * (lo + hi)), ACT == 4u);
        }
    }
}
