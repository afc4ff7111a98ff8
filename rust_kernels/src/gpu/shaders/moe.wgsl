// Mixture-of-experts FFN around the expert products (matmul.wgsl with MOE = 1), as the CPU kernel
// rust_kernels/src/moe.rs computes it:
//   route:   per token row: ggml's softmax of the router logits, libstdc++'s std::sort of the
//            experts by descending probability (the same order on ties), the first k, their
//            probabilities renormalised and scaled;
//   plan:    the (token, slot) pairs grouped by expert in pair order, cut into tiles of <= 8;
//   combine: the weighted sum of each row's expert outputs in slot order, plus the shared expert.
// The CPU sums in f64 in two places (the softmax's sum, the renormalisation's sum); WGSL has no
// f64, so those sums are done in an integer emulation of f64 (non-negative values only), rounded
// as the CPU rounds them (f64.wgsl); divisions are correctly rounded (math.wgsl's div_rn). Needs
// math.wgsl and f64.wgsl.

const MAX_EXPERTS: u32 = 512u;
const TILE: u32 = 8u;

struct Params {
    n: u32,         // token rows
    n_expert: u32,
    k: u32,         // experts used per row
    norm: u32,      // renormalise the selected probabilities
    scale: f32,     // applied unless 0 or 1
    n_embd: u32,
    sh_mode: u32,   // 0: no shared expert, 1: ungated, 2: gated by sigmoid(gsh)
    groups_x: u32,
    pairs: u32,     // n * k
    max_tiles: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;         // n x n_expert
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;      // n x k
@group(0) @binding(2) var<storage, read_write> wts: array<f32>;      // n x k
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> plan: array<u32>;     // pairs, then tiles x 4
@group(0) @binding(5) var<storage, read> y: array<f32>;              // pairs x n_embd
@group(0) @binding(6) var<storage, read_write> dst: array<f32>;      // n x n_embd
@group(0) @binding(7) var<storage, read> ysh: array<f32>;            // n x n_embd
@group(0) @binding(8) var<storage, read> gsh: array<f32>;            // n

// ---- ggml's argsort: libstdc++'s std::sort (introsort) step for step (moe.rs argsort_desc) --------

var<private> pr: array<f32, MAX_EXPERTS>;   // one row's probabilities
var<private> idx: array<u32, MAX_EXPERTS>;  // the permutation being sorted

fn gt(a: u32, b: u32) -> bool {
    return pr[a] > pr[b];
}

fn swap_at(i: u32, j: u32) {
    let t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
}

fn move_median_to_first(result: u32, x: u32, y: u32, z: u32) {
    let vx = idx[x];
    let vy = idx[y];
    let vz = idx[z];
    var median = y;
    if gt(vx, vy) {
        if gt(vy, vz) {
            median = y;
        } else if gt(vx, vz) {
            median = z;
        } else {
            median = x;
        }
    } else if gt(vx, vz) {
        median = x;
    } else if gt(vy, vz) {
        median = z;
    }
    swap_at(result, median);
}

fn unguarded_partition(first0: u32, last0: u32, pivot: u32) -> u32 {
    var first = first0;
    var last = last0;
    loop {
        while gt(idx[first], idx[pivot]) {
            first++;
        }
        last--;
        while gt(idx[pivot], idx[last]) {
            last--;
        }
        if first >= last {
            return first;
        }
        swap_at(first, last);
        first++;
    }
    return first;
}

fn linear_insert(pos0: u32) {
    let v = idx[pos0];
    var pos = pos0;
    while pos > 0u && gt(v, idx[pos - 1u]) {
        idx[pos] = idx[pos - 1u];
        pos--;
    }
    idx[pos] = v;
}

fn insertion_sort(first: u32, last: u32) {
    for (var i = first + 1u; i < last; i++) {
        if gt(idx[i], idx[first]) {
            let v = idx[i];
            for (var j = i; j > first; j--) {
                idx[j] = idx[j - 1u];
            }
            idx[first] = v;
        } else {
            linear_insert(i);
        }
    }
}

fn adjust_heap(first: u32, hole0: u32, len: u32, value: u32) {
    let top = hole0;
    var hole = hole0;
    var child = hole0;
    while len >= 1u && child < (len - 1u) / 2u {
        child = 2u * (child + 1u);
        if gt(idx[first + child], idx[first + child - 1u]) {
            child--;
        }
        idx[first + hole] = idx[first + child];
        hole = child;
    }
    if len % 2u == 0u && len >= 2u && child == (len - 2u) / 2u {
        child = 2u * (child + 1u);
        idx[first + hole] = idx[first + child - 1u];
        hole = child - 1u;
    }
    while hole > top {
        let parent = (hole - 1u) / 2u;
        if !gt(idx[first + parent], value) {
            break;
        }
        idx[first + hole] = idx[first + parent];
        hole = parent;
    }
    idx[first + hole] = value;
}

fn heap_sort(first: u32, last: u32) {
    let len = last - first;
    if len >= 2u {
        var parent = (len - 2u) / 2u;
        loop {
            adjust_heap(first, parent, len, idx[first + parent]);
            if parent == 0u {
                break;
            }
            parent--;
        }
    }
    var end = last;
    while end - first > 1u {
        end--;
        let v = idx[end];
        idx[end] = idx[first];
        adjust_heap(first, 0u, end - first, v);
    }
}

// Sorts idx[0..n] by descending pr. The recursion of introsort_loop (on the right part) becomes
// an explicit stack of the callers' remaining ranges; the parts are disjoint, so the result is the
// same, and the stack never holds more frames than the recursion depth (2 log2 n).
fn argsort_desc(n: u32) {
    for (var i = 0u; i < n; i++) {
        idx[i] = i;
    }
    if n <= 1u {
        return;
    }
    var st_first: array<u32, 32>;
    var st_last: array<u32, 32>;
    var st_depth: array<u32, 32>;
    var sp = 0u;
    var first = 0u;
    var last = n;
    var depth = 2u * (31u - countLeadingZeros(n));
    loop {
        // introsort_loop(first, last, depth)
        while last - first > 16u {
            if depth == 0u {
                heap_sort(first, last);
                break;
            }
            depth--;
            let mid = first + (last - first) / 2u;
            move_median_to_first(first, first + 1u, mid, last - 1u);
            let cut = unguarded_partition(first + 1u, last, first);
            // recurse on (cut, last, depth), then continue here with (first, cut)
            st_first[sp] = first;
            st_last[sp] = cut;
            st_depth[sp] = depth;
            sp++;
            first = cut;
        }
        if sp == 0u {
            break;
        }
        sp--;
        first = st_first[sp];
        last = st_last[sp];
        depth = st_depth[sp];
    }
    // final_insertion_sort
    if n > 16u {
        insertion_sort(0u, 16u);
        for (var i = 16u; i < n; i++) {
            linear_insert(i);
        }
    } else {
        insertion_sort(0u, n);
    }
}

// ---- entry points --------------------------------------------------------------------------------

// One invocation per token row: the row's experts (ids) and weights (wts), as moe.rs `route`.
@compute @workgroup_size(64)
fn route(@builtin(global_invocation_id) g: vec3<u32>) {
    let row = g.x + g.y * p.groups_x * 64u;
    if row >= p.n {
        return;
    }
    let n = p.n_expert;
    let base = row * n;
    // ggml's CPU softmax: vectorised exp on groups of 8 (hsum8 into an f64), libm's exp on the tail
    var mx = bitcast<f32>(0xff800000u);
    for (var e = 0u; e < n; e++) {
        mx = max(mx, logits[base + e]);
    }
    var sum = f64_zero();
    let full = n / 8u * 8u;
    for (var e0 = 0u; e0 < full; e0 += 8u) {
        for (var i = 0u; i < 8u; i++) {
            pr[e0 + i] = expf_ggml(logits[base + e0 + i] - mx);
        }
        let h = ((pr[e0] + pr[e0 + 4u]) + (pr[e0 + 2u] + pr[e0 + 6u]))
            + ((pr[e0 + 1u] + pr[e0 + 5u]) + (pr[e0 + 3u] + pr[e0 + 7u]));
        sum = f64_add(sum, f64_of(h));
    }
    for (var e = full; e < n; e++) {
        pr[e] = exp(logits[base + e] - mx);
        sum = f64_add(sum, f64_of(pr[e]));
    }
    let inv = recip_f32(sum);
    for (var e = 0u; e < n; e++) {
        pr[e] = pr[e] * inv;
    }
    argsort_desc(n);
    let k = p.k;
    var wsum = 0.0;
    if p.norm != 0u {
        var s = f64_zero();
        for (var j = 0u; j < k; j++) {
            s = f64_add(s, f64_of(pr[idx[j]]));
        }
        // ggml clamps the sum to the smallest normal f16
        wsum = max(f32_of(s), 6.1035156e-5);
    }
    for (var j = 0u; j < k; j++) {
        var v = pr[idx[j]];
        if p.norm != 0u {
            v = div_rn(v, wsum);
        }
        if p.scale != 0.0 && p.scale != 1.0 {
            v = v * p.scale;
        }
        ids[row * k + j] = idx[j];
        wts[row * k + j] = v;
    }
}

var<workgroup> counts: array<u32, MAX_EXPERTS>;
var<workgroup> starts: array<u32, MAX_EXPERTS>;

// One workgroup: the pairs (row * k + slot) grouped by expert, in pair order, then tiles of up to
// TILE pairs of one expert: (expert, first list index, pairs, 0); unused tiles have 0 pairs.
@compute @workgroup_size(64)
fn plan_pairs(@builtin(local_invocation_index) lid: u32) {
    let n_pairs = p.pairs;
    for (var e = lid; e < p.n_expert; e += 64u) {
        var c = 0u;
        for (var j = 0u; j < n_pairs; j++) {
            c += select(0u, 1u, ids[j] == e);
        }
        counts[e] = c;
    }
    workgroupBarrier();
    if lid == 0u {
        var at = 0u;
        var t = 0u;
        for (var e = 0u; e < p.n_expert; e++) {
            starts[e] = at;
            for (var j = 0u; j < counts[e]; j += TILE) {
                let o = n_pairs + 4u * t;
                plan[o] = e;
                plan[o + 1u] = at + j;
                plan[o + 2u] = min(TILE, counts[e] - j);
                plan[o + 3u] = 0u;
                t++;
            }
            at += counts[e];
        }
        for (; t < p.max_tiles; t++) {
            let o = n_pairs + 4u * t;
            plan[o] = 0u;
            plan[o + 1u] = 0u;
            plan[o + 2u] = 0u;
            plan[o + 3u] = 0u;
        }
    }
    workgroupBarrier();
    for (var e = lid; e < p.n_expert; e += 64u) {
        var at = starts[e];
        for (var j = 0u; j < n_pairs; j++) {
            if ids[j] == e {
                plan[at] = j;
                at++;
            }
        }
    }
}

// One invocation per output value: the expert outputs weighted and summed in slot order (the
// first as a product, then `+=` products, as moe.rs), then the shared expert's output.
@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x + g.y * p.groups_x * 64u;
    if i >= p.n * p.n_embd {
        return;
    }
    let row = i / p.n_embd;
    let c = i % p.n_embd;
    var o = 0.0;
    for (var s = 0u; s < p.k; s++) {
        let pair = row * p.k + s;
        let v = y[pair * p.n_embd + c] * wts[pair];
        if s == 0u {
            o = v;
        } else {
            o = o + v;
        }
    }
    if p.sh_mode == 1u {
        o = o + ysh[i];
    } else if p.sh_mode == 2u {
        // ggml_sigmoid: 1 / (1 + exp(-x))
        let gate = div_rn(1.0, 1.0 + exp(-gsh[row]));
        o = o + ysh[i] * gate;
    }
    dst[i] = o;
}
