// quantize_fast.wgsl's input computed in place: a gated unit, GEGLU (GATE 4, gelu(gate) * up) or
// SwiGLU (GATE 5, silu(gate) * up), written to y as it is quantized for the down projection.
// Each value is computed once, by the thread that quantizes it, with elementwise.wgsl's formula
// (OP 4 / 5), so y and the quants are the bits of the gated unit and a quantization pass after it.
// Needs math.wgsl and activations.wgsl.

override GATE: u32 = 5u;

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read> up: array<f32>;

fn act_in(at: u32) -> f32 {
    var v: f32;
    if GATE == 4u {
        v = gelu(gate[at]) * up[at];
    } else {
        v = silu(gate[at]) * up[at];
    }
    y[at] = v;
    return v;
}
