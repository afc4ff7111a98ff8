// norm.wgsl's input, read only.
@group(0) @binding(0) var<storage, read> x: array<f32>;

fn take_x(at: u32) -> f32 {
    return x[at];
}
