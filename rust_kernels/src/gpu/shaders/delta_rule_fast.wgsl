// The Gated DeltaNet recurrence in fast numerics (see delta_rule.wgsl for the rule and the state
// layout [h][j][i]). delta_rule.wgsl gives one invocation a whole state row and walks it in memory
// for every token; here 32 lanes share a row and hold it in registers for all the call's tokens:
// lane l owns keys l, l + 32, ... (neighbouring lanes read neighbouring addresses), the state is
// read once and written once per call, and a token's two dot products are joined across the lanes
// through workgroup memory by one fixed tree. The order of operations is a function of d_k alone,
// and tokens run in order, so a row's bits never depend on the batch, the chunking or the run.
// Per token: the decay, S k together with the squares of q and k (their L2 norms where the rule
// normalises them, fast numerics' `l2`), then the update, then S q: two barriers.
// Sizes and bindings: delta_rule_io.wgsl.

const LANES: u32 = 32u;
const ROWS: u32 = 2u;      // state rows per workgroup
const PER_LANE: u32 = 8u;  // keys per lane: d_k up to 256

// Each lane's partial sums: (S k, q.q, k.k) for a token's first step, S q for its second. Two
// arrays, so a token's first writes never race the last token's reads of the other.
var<workgroup> first_sums: array<vec3<f32>, 64>;
var<workgroup> second_sums: array<f32, 64>;

// The 32 partials of a row, joined by one fixed tree.
fn join_first(base: u32) -> vec3<f32> {
    var x: array<vec3<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        x[i] = (first_sums[base + i] + first_sums[base + 16u + i]) + (first_sums[base + 8u + i] + first_sums[base + 24u + i]);
    }
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

fn join_second(base: u32) -> f32 {
    var x: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        x[i] = (second_sums[base + i] + second_sums[base + 16u + i]) + (second_sums[base + 8u + i] + second_sums[base + 24u + i]);
    }
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let base = li - lane;
    let idx = (wid.x + wid.y * p.groups_x) * ROWS + li / LANES;
    // rows past the end keep to the barriers and touch no memory
    let live = idx < p.nv * p.dv;
    let row_index = min(idx, p.nv * p.dv - 1u);
    let h = row_index / p.dv;
    let j = row_index % p.dv;
    let hk = k_head(h);
    let row = row_index * p.dk;

    var s: array<f32, PER_LANE>;
    for (var m = 0u; m < PER_LANE; m++) {
        let i = lane + m * LANES;
        s[m] = 0.0;
        if live && i < p.dk {
            if p.t0 == 0u {
                s[m] = state_in[row + i];
            } else {
                s[m] = state_out[row + i];
            }
        }
    }

    for (var t = p.t0; t < p.n; t++) {
        let at_q = t * p.qk_stride + hk * p.dk;
        let at_k = at_q + p.nk * p.dk;
        let decay = exp(g[t * p.nv + h]);
        var q: array<f32, PER_LANE>;
        var k: array<f32, PER_LANE>;
        var part = vec3<f32>(0.0);
        for (var m = 0u; m < PER_LANE; m++) {
            let i = lane + m * LANES;
            q[m] = 0.0;
            k[m] = 0.0;
            if i < p.dk {
                q[m] = qk[at_q + i];
                k[m] = qk[at_k + i];
                s[m] = s[m] * decay;
                part = fma(vec3<f32>(s[m], q[m], k[m]), vec3<f32>(k[m], q[m], k[m]), part);
            }
        }
        first_sums[li] = part;
        workgroupBarrier();
        let sums = join_first(base);
        // the L2 scales of q and k times the norm's weight (1 where the inputs came normalised)
        var scale_q = 1.0;
        var scale_k = 1.0;
        if p.l2 != 0u {
            let dk = f32(p.dk);
            scale_q = p.l2_weight / sqrt(sums.y / dk + p.l2_eps);
            scale_k = p.l2_weight / sqrt(sums.z / dk + p.l2_eps);
        }
        let delta = (v[t * p.v_stride + p.v_offset + h * p.dv + j] - sums.x * scale_k) * beta[t * p.nv + h];
        let k_step = delta * scale_k;  // S[i] += (k[i] scale_k) delta, as k[i] (scale_k delta)
        var dot_q = 0.0;
        for (var m = 0u; m < PER_LANE; m++) {
            s[m] = fma(k[m], k_step, s[m]);
            dot_q = fma(s[m], q[m], dot_q);
        }
        second_sums[li] = dot_q;
        workgroupBarrier();
        let sq = join_second(base);
        if live && lane == 0u {
            out[(t * p.nv + h) * p.dv + j] = sq * scale_q * p.scale;
        }
    }

    for (var m = 0u; m < PER_LANE; m++) {
        let i = lane + m * LANES;
        if live && i < p.dk {
            state_out[row + i] = s[m];
        }
    }
}
