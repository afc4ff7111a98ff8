// Rotary position embedding in place on rows of n_head x head_dim, one position per row.
// Pair i (< n_rot/2) turns by freq_scale * pos * theta_scale^i, theta_scale = base^(-2/n_rot) (the
// power taken step by step in f32, as the CPU does): dims (2i, 2i+1), or (i, i + n_rot/2)
// with NEOX; dims past n_rot pass through. One invocation per (row, head, pair).

struct Params {
    n_head: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    theta_scale: f32,
    freq_scale: f32,
    total: u32,  // rows x n_head x n_rot/2
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<i32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let idx = g.x + g.y * p.groups_x * 64u;
    if idx >= p.total {
        return;
    }
    let half = p.n_rot / 2u;
    let i = idx % half;
    let head = (idx / half) % p.n_head;
    let row = idx / (half * p.n_head);
    var theta = f32(positions[row]);
    for (var k = 0u; k < i; k++) {
        theta *= p.theta_scale;
    }
    theta = p.freq_scale * theta;
    let c = cos(theta);
    let s = sin(theta);
    let o = (row * p.n_head + head) * p.head_dim;
    var a = o + 2u * i;
    var b = a + 1u;
    if p.neox != 0u {
        a = o + i;
        b = a + half;
    }
    let x0 = x[a];
    let x1 = x[b];
    x[a] = fma(x0, c, -(x1 * s));
    x[b] = fma(x0, s, x1 * c);
}
