// The gated delta rule's sizes, bindings and head mapping, shared by its kernels (delta_rule.wgsl
// in exact numerics, delta_rule_fast.wgsl in fast).

struct Params {
    n: u32,       // tokens: this dispatch runs tokens t0 .. n
    nk: u32,      // q/k heads
    nv: u32,      // v heads
    dk: u32,
    dv: u32,
    grouped: u32, // v head h uses k head h / (nv/nk) (qwen3next), else h % nk (qwen35)
    scale: f32,   // 1 / sqrt(dk)
    groups_x: u32,
    v_stride: u32, // values per row of the v input
    v_offset: u32, // where v starts in its row (a delta-net layer's convolution output holds q|k|v)
    qk_stride: u32, // values per token row of the qk input (q then k at its start)
    l2: u32,       // 1: q and k are L2-normalised here (fast numerics), not by a norm pass first
    l2_eps: f32,   // that norm's eps and weight: rms_norm(x, eps / dk) * (1 / sqrt(dk))
    l2_weight: f32,
    t0: u32,      // the first token this dispatch runs (past 0: it continues from state_out)
    _b: u32,
}

@group(0) @binding(0) var<storage, read> qk: array<f32>;   // n x qk_stride: [q: nk x dk | k: nk x dk ...]
@group(0) @binding(1) var<storage, read> v: array<f32>;    // n x v_stride, v at v_offset: nv x dv
@group(0) @binding(2) var<storage, read> g: array<f32>;    // n x nv (log decay)
@group(0) @binding(3) var<storage, read> beta: array<f32>; // n x nv
@group(0) @binding(4) var<storage, read> state_in: array<f32>;            // nv x dv x dk
@group(0) @binding(5) var<storage, read_write> state_out: array<f32>;     // nv x dv x dk
@group(0) @binding(6) var<storage, read_write> out: array<f32>;           // n x nv x dv
@group(0) @binding(7) var<uniform> p: Params;

// The q/k head v head h reads: h / (nv / nk) where heads are grouped (qwen3next), else h % nk (qwen35).
fn k_head(h: u32) -> u32 {
    if p.grouped != 0u {
        return h / (p.nv / p.nk);
    }
    return h % p.nk;
}
