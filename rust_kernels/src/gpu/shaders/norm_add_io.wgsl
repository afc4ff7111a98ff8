// norm.wgsl's input for a residual stream: x += a is computed as the norm reads it and written
// back. Each thread adds exactly the values it later reads and scales (the same strided indices),
// so no barrier is needed, and the sum is the bits of a separate `dst += a`.
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<storage, read> a: array<f32>;

fn take_x(at: u32) -> f32 {
    let v = x[at] + a[at];
    x[at] = v;
    return v;
}
