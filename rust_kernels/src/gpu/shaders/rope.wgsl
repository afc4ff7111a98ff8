// Rotary position embedding in place on rows of n_head x head_dim, one position per row.
// Pair i (< n_rot/2) turns by the angle whose (cos, sin) the host computed for the row (the CPU
// kernel's own angles: a shader's sin/cos differ from libm's in the last bits): dims (2i, 2i+1),
// or (i, i + n_rot/2) with NEOX; dims past n_rot pass through. One invocation per (row, head, pair).
// The rotation uses the CPU's fused multiply-adds. Needs math.wgsl and rope_pair.wgsl.

struct Params {
    n_head: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    _a: u32,
    _b: u32,
    total: u32,  // rows x n_head x n_rot/2
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> angles: array<vec2<f32>>;  // row x pair: (cos, sin)
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
    let o = (row * p.n_head + head) * p.head_dim;
    let d = rope_dims(o, i, half, p.neox != 0u);
    let r = rope_pair(vec2<f32>(x[d.x], x[d.y]), angles[row * half + i]);
    x[d.x] = r.x;
    x[d.y] = r.y;
}
