// quantize_fast.wgsl's input: the activations as they are.
@group(0) @binding(0) var<storage, read> x: array<f32>;

fn act_in(at: u32) -> f32 {
    return x[at];
}
