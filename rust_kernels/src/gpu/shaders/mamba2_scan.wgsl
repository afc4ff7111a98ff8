// The Mamba2 selective scan (ggml_ssm_scan with a scalar decay per head) plus the D skip, as the
// CPU kernel (rust_kernels/src/recurrent/mod.rs) runs it, per head h (group h / (H/G)) and token:
//   dt' = softplus(dt[h] + dt_bias[h]);  dA = exp(dt' A[h]);
//   s[h,p,n] <- fma(s, dA, B[g,n] (x[h,p] dt'));  y[h,p] = sum_n s[h,p,n] C[g,n] + x[h,p] D[h]
// One invocation owns one state row (h, p) for all tokens, in order; the sum over n in the CPU's
// order (32 fused lanes, ggml's lane reduction, then sequential fused multiply-adds).
// Sizes and bindings: mamba2_scan_io.wgsl.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x + gid.y * p.groups_x * 64u;
    if idx >= p.nh * p.hd {
        return;
    }
    let h = idx / p.hd;
    let grp = h / (p.nh / p.ng);
    let row = idx * p.ns;
    if p.t0 == 0u {
        for (var i = 0u; i < p.ns; i++) {
            state_out[row + i] = state_in[row + i];
        }
    }
    let np = p.ns & ~31u;
    for (var t = p.t0; t < p.n; t++) {
        let dt_sp = softplus(dt[t * p.nh + h] + heads[2u * p.nh + h]);
        let da = exp(dt_sp * heads[h]);
        let xv = x[(t * p.nh + h) * p.hd + idx % p.hd];
        let x_dt = xv * dt_sp;
        let at = (t * p.ng + grp) * p.ns;
        var lanes: array<f32, 32>;
        for (var l = 0u; l < 32u; l++) {
            lanes[l] = 0.0;
        }
        // B·x_dt rounded on its own as the CPU's: `mul_soft`, so that no driver folds it into the fma
        for (var i = 0u; i < np; i++) {
            let s = fma(state_out[row + i], da, mul_soft(bmat[at + i], x_dt));
            state_out[row + i] = s;
            lanes[i % 32u] = fma(s, cmat[at + i], lanes[i % 32u]);
        }
        var xs: array<f32, 8>;
        for (var i = 0u; i < 8u; i++) {
            xs[i] = (lanes[i] + lanes[16u + i]) + (lanes[8u + i] + lanes[24u + i]);
        }
        var sum = ((xs[0] + xs[4]) + (xs[1] + xs[5])) + ((xs[2] + xs[6]) + (xs[3] + xs[7]));
        for (var i = np; i < p.ns; i++) {
            let s = fma(state_out[row + i], da, mul_soft(bmat[at + i], x_dt));
            state_out[row + i] = s;
            sum = fma(s, cmat[at + i], sum);
        }
        // `y + x D` as two graph ops: two roundings
        let skip = mul_soft(xv, heads[p.nh + h]);
        out[(t * p.nh + h) * p.hd + idx % p.hd] = sum + skip;
    }
}
