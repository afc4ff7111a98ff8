// norm.wgsl's input for a gated group norm (Mamba2's output: y *= silu(z), then the norm): each
// value is gated as the norm reads it and written back. Each thread gates exactly the values it
// later reads and scales (the same strided indices), so no barrier is needed, and the gated
// values are the bits of elementwise.wgsl's `dst = silu(a) * dst`. Needs activations.wgsl.
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(9) var<storage, read> gate: array<f32>;

fn take_x(at: u32) -> f32 {
    let v = silu(gate[at]) * x[at];
    x[at] = v;
    return v;
}
