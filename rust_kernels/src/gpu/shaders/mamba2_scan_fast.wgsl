// The Mamba2 selective scan with the D skip in fast numerics (see mamba2_scan.wgsl for the
// formulas and the state layout H x P x N). 32 lanes share a state row (h, p) and hold it in
// registers for all the call's tokens: lane l owns states l, l + 32, ... (neighbouring lanes read
// neighbouring addresses), the state is read once and written once per call, and a token's sum
// over N is joined across the lanes through workgroup memory by one fixed tree. The order of
// operations is a function of N alone and tokens run in order, so a row's bits never depend on
// the batch, the chunking or the run.
// Sizes and bindings: mamba2_scan_io.wgsl.

const LANES: u32 = 32u;
const ROWS: u32 = 2u;      // state rows per workgroup
const PER_LANE: u32 = 8u;  // states per lane: N up to 256

// Each lane's partial sum, in two halves by the token's parity, so that a token's writes never
// race the last token's reads.
var<workgroup> sums: array<f32, 128>;

// The 32 partials from `at`, joined by one fixed tree.
fn join(at: u32) -> f32 {
    var x: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        x[i] = (sums[at + i] + sums[at + 16u + i]) + (sums[at + 8u + i] + sums[at + 24u + i]);
    }
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let idx = (wid.x + wid.y * p.groups_x) * ROWS + li / LANES;
    // rows past the end keep to the barriers and touch no memory
    let live = idx < p.nh * p.hd;
    let row_index = min(idx, p.nh * p.hd - 1u);
    let h = row_index / p.hd;
    let grp = h / (p.nh / p.ng);
    let row = row_index * p.ns;

    var s: array<f32, PER_LANE>;
    for (var m = 0u; m < PER_LANE; m++) {
        let i = lane + m * LANES;
        s[m] = 0.0;
        if live && i < p.ns {
            if p.t0 == 0u {
                s[m] = state_in[row + i];
            } else {
                s[m] = state_out[row + i];
            }
        }
    }

    for (var t = p.t0; t < p.n; t++) {
        let dt_sp = softplus(dt[t * p.nh + h] + heads[2u * p.nh + h]);
        let da = exp(dt_sp * heads[h]);
        let xv = x[t * p.nh * p.hd + row_index];
        let x_dt = xv * dt_sp;
        let at = (t * p.ng + grp) * p.ns;
        var part = 0.0;
        for (var m = 0u; m < PER_LANE; m++) {
            let i = lane + m * LANES;
            if i < p.ns {
                s[m] = fma(s[m], da, bmat[at + i] * x_dt);
                part = fma(s[m], cmat[at + i], part);
            }
        }
        let parity_at = (t & 1u) * 64u;
        sums[parity_at + li] = part;
        workgroupBarrier();
        let y = join(parity_at + li - lane);
        if live && lane == 0u {
            out[t * p.nh * p.hd + row_index] = y + xv * heads[p.nh + h];
        }
    }

    for (var m = 0u; m < PER_LANE; m++) {
        let i = lane + m * LANES;
        if live && i < p.ns {
            state_out[row + i] = s[m];
        }
    }
}
