// The Gated DeltaNet recurrence (Qwen3.5 / Qwen3-Next linear attention), as the CPU kernel
// (rust_kernels/src/recurrent/, llama.cpp's GATED_DELTA_NET) runs it, per v head h and per token:
//   S <- exp(g) S;  delta[j] = beta (v[j] - sum_i S[i,j] k[i]);  S[i,j] += k[i] delta[j];
//   o[j] = (sum_i S[i,j] q[i]) / sqrt(d_k)
// State layout [h][j][i] (key index contiguous). State rows j are independent, so one invocation
// owns one (head, row) for all tokens, in order: no cross-invocation reduction, and the bits of a
// token do not depend on how the sequence was chunked. Dot products in the CPU's order: 32 lanes of
// fused multiply-adds over the first d_k & ~31 keys, ggml's lane reduction, then the tail in order.
// Each of a token's two state steps (decay, update) is fused with the dot product that reads its
// result: two passes over a state row per token, each reading and writing it once.
// Sizes and bindings: delta_rule_io.wgsl.

// where the CPU switches from rounded products to fused multiply-adds for a tail of n terms
fn fused_from(n: u32) -> u32 {
    let n8 = n & ~7u;
    return select(n8, n8 + 4u, n - n8 >= 4u);
}

fn reduce32(l: ptr<function, array<f32, 32>>) -> f32 {
    var x: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        x[i] = ((*l)[i] + (*l)[16u + i]) + ((*l)[8u + i] + (*l)[24u + i]);
    }
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

// Element i of the q or k head at `at`, times the head's L2 scale `s` and the norm's weight when
// normalised here (x * scale, then * weight, as norm.wgsl writes a normalised value).
fn qk_at(at: u32, i: u32, s: f32) -> f32 {
    if p.l2 != 0u {
        return qk[at + i] * s * p.l2_weight;
    }
    return qk[at + i];
}

// 1 / sqrt(mean(x^2) + eps) of the head at `at`, the squares summed in order with fma (a fixed
// order per token: the bits never depend on the batch or the chunking).
fn l2_scale(at: u32) -> f32 {
    var sum = 0.0;
    for (var i = 0u; i < p.dk; i++) {
        let x = qk[at + i];
        sum = fma(x, x, sum);
    }
    return 1.0 / sqrt(sum / f32(p.dk) + p.l2_eps);
}

// The next value of the state at row + i: the decay (`update` false; from state_in on the call's
// first token), or the delta update with the token's k at `at_k` (L2 scale s_k).
fn next_value(row: u32, i: u32, update: bool, first: bool, c: f32, at_k: u32, s_k: f32) -> f32 {
    if update {
        return fma(qk_at(at_k, i, s_k), c, state_out[row + i]);
    }
    if first {
        return state_in[row + i] * c;
    }
    return state_out[row + i] * c;
}

// Writes the state row's next values (`next_value`) and returns their dot product with the q or k
// head at `at`, in the CPU's order: one pass over the row where a step and then a dot product
// would take two (the same operations on the same values, so the same bits).
fn step_dot(row: u32, update: bool, first: bool, c: f32, at_k: u32, s_k: f32, at: u32, s_at: f32) -> f32 {
    let n = p.dk;
    let np = n & ~31u;
    var lanes: array<f32, 32>;
    for (var l = 0u; l < 32u; l++) {
        lanes[l] = 0.0;
    }
    for (var i = 0u; i < np; i++) {
        let s = next_value(row, i, update, first, c, at_k, s_k);
        state_out[row + i] = s;
        lanes[i % 32u] = fma(s, qk_at(at, i, s_at), lanes[i % 32u]);
    }
    var sum = reduce32(&lanes);
    let split = np + fused_from(n - np);
    for (var i = np; i < n; i++) {
        let s = next_value(row, i, update, first, c, at_k, s_k);
        state_out[row + i] = s;
        if i < split {
            sum = sum + mul_soft(s, qk_at(at, i, s_at));  // rounded, as the CPU's (never fused)
        } else {
            sum = fma(s, qk_at(at, i, s_at), sum);
        }
    }
    return sum;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x + gid.y * p.groups_x * 64u;
    if idx >= p.nv * p.dv {
        return;
    }
    let h = idx / p.dv;
    let j = idx % p.dv;
    let hk = k_head(h);
    let row = idx * p.dk;
    for (var t = p.t0; t < p.n; t++) {
        let at_q = t * p.qk_stride + hk * p.dk;
        let at_k = at_q + p.nk * p.dk;
        var s_q = 1.0;
        var s_k = 1.0;
        if p.l2 != 0u {
            s_q = l2_scale(at_q);
            s_k = l2_scale(at_k);
        }
        let decay = exp(g[t * p.nv + h]);
        let sk = step_dot(row, false, t == 0u, decay, 0u, 1.0, at_k, s_k);  // S <- exp(g) S, then S k
        let delta = (v[t * p.v_stride + p.v_offset + h * p.dv + j] - sk) * beta[t * p.nv + h];
        // S += k delta, then S q
        out[(t * p.nv + h) * p.dv + j] = step_dot(row, true, false, delta, at_k, s_k, at_q, s_q) * p.scale;
    }
}
