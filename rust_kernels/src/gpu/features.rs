//! Optional adapter features the shaders use where the adapter has them, each with the plain WGSL
//! as its fallback and each giving the same bits as the fallback:
//!
//! - `subgroups`: the matmul joins a weight row's eight lanes with subgroup shuffles instead of a
//!   round trip through workgroup memory and a barrier (matmul.wgsl, LANES = 8).
//! - `f16`: f32 -> f16 rounding (KV cache, f16-rounded activations) by the hardware's conversion
//!   instead of math.wgsl's integer code.
//!
//! WGSL leaves the layout of subgroups and the rounding of float conversions to the implementation,
//! so a feature is used only after a probe on the device shows it behaves as the fallback computes
//! (`Gpu::open`). Shader variants are chosen by a tiny preprocessor: `//#if NAME`, `//#else`,
//! `//#endif` lines in the WGSL sources, NAME a feature or `exact` (the numerics mode, numerics.rs).

use super::device::{Access, Gpu, Kernel};
use super::Numerics;

/// The features by name, as `--gpu-features` / `HYSERVE_WGPU_FEATURES` and `GpuDevice` spell them.
pub const NAMES: [&str; 2] = ["subgroups", "f16"];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShaderFeatures {
    pub subgroups: bool,
    pub f16: bool,
}

impl ShaderFeatures {
    /// The features asked for (None: all of them) that the adapter has. Unknown names are errors.
    pub fn offered(requested: Option<&[String]>, adapter: &wgpu::Adapter) -> Result<Self, String> {
        let asked = |name: &str| requested.is_none_or(|r| r.iter().any(|n| n == name));
        if let Some(unknown) = requested
            .unwrap_or_default()
            .iter()
            .find(|n| !NAMES.contains(&n.as_str()))
        {
            return Err(format!(
                "unknown GPU feature {unknown:?} (known: {})",
                NAMES.join(", ")
            ));
        }
        let has = adapter.features();
        let info = adapter.get_info();
        Ok(Self {
            // a row's eight lanes must share a subgroup, whatever size the compiler picks
            subgroups: asked("subgroups")
                && has.contains(wgpu::Features::SUBGROUP)
                && info.subgroup_min_size >= 8,
            f16: asked("f16") && has.contains(wgpu::Features::SHADER_F16),
        })
    }

    /// The device features these need.
    pub fn required(self) -> wgpu::Features {
        let mut f = wgpu::Features::empty();
        if self.subgroups {
            f |= wgpu::Features::SUBGROUP;
        }
        if self.f16 {
            f |= wgpu::Features::SHADER_F16;
        }
        f
    }

    pub fn names(self) -> Vec<&'static str> {
        NAMES.into_iter().filter(|&n| self.has(n)).collect()
    }

    fn has(self, name: &str) -> bool {
        match name {
            "subgroups" => self.subgroups,
            "f16" => self.f16,
            _ => false,
        }
    }
}

/// The source with the `//#if NAME` / `//#else` / `//#endif` blocks resolved for `features` and
/// `numerics` (`exact` is on in exact numerics), and the `enable` directive that `f16` needs in
/// front. Blocks nest.
pub fn preprocess(source: &str, features: ShaderFeatures, numerics: Numerics) -> String {
    let defined = |name: &str| {
        if name == "exact" {
            numerics == Numerics::Exact
        } else {
            features.has(name)
        }
    };
    let mut out = String::with_capacity(source.len() + 16);
    if features.f16 {
        out.push_str("enable f16;\n");
    }
    // one entry per open block: whether its current branch is kept
    let mut kept: Vec<bool> = Vec::new();
    for line in source.lines() {
        let directive = line.trim_start();
        if let Some(name) = directive.strip_prefix("//#if ") {
            let outer = kept.last().copied().unwrap_or(true);
            kept.push(outer && defined(name.trim()));
        } else if directive.starts_with("//#else") {
            let n = kept.len();
            let outer = n < 2 || kept[n - 2];
            if let Some(k) = kept.last_mut() {
                *k = outer && !*k;
            }
        } else if directive.starts_with("//#endif") {
            kept.pop();
        } else if kept.last().copied().unwrap_or(true) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Runs a probe with the device's validation errors caught: a shader the driver or wgpu rejects
/// means the feature is not used, not a failed open.
pub fn probe(gpu: &Gpu, check: fn(&Gpu) -> bool) -> bool {
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let passed = check(gpu);
    pollster::block_on(scope.pop()).is_none() && passed
}

static SUBGROUP_PROBE: Kernel = Kernel {
    name: "subgroup_probe",
    sources: &[
        "@group(0) @binding(0) var<storage, read_write> v: array<u32>;
@group(0) @binding(1) var<uniform> unused: vec4<u32>;
@compute @workgroup_size(64)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let i = wg.x * 64u + lid;
    v[2u * i] = sg_lane | (sg_size << 16u);
    v[2u * i + 1u] = subgroupShuffle(lid, sg_lane ^ 7u) + unused.x;
}
",
    ],
    entry: "main",
    bindings: &[(0, Access::ReadWrite), (1, Access::Uniform)],
};

/// Whether subgroups are laid out as matmul.wgsl assumes: invocation `lid` of a workgroup of 64 is
/// lane `lid % size` of its subgroup, sizes of 8 or more, and shuffles move what they should.
pub fn probe_subgroups(gpu: &Gpu) -> bool {
    let groups = 4u32;
    let out = gpu.alloc(u64::from(groups) * 64 * 8);
    gpu.dispatch(
        &SUBGROUP_PROBE,
        &[],
        &[out.raw()],
        &[0u8; 16],
        [groups, 1, 1],
    );
    let got: Vec<u32> = bytemuck::pod_collect_to_vec(&gpu.read(out.raw(), 0, out.bytes));
    got.chunks_exact(2).enumerate().all(|(i, pair)| {
        let lid = i as u32 % 64;
        let size = pair[0] >> 16;
        size >= 8 && size.is_power_of_two() && pair[0] & 0xffff == lid % size && pair[1] == lid ^ 7
    })
}

static F16_PROBE: Kernel = Kernel {
    name: "f16_probe",
    sources: &[
        include_str!("shaders/math.wgsl"),
        "@group(0) @binding(0) var<storage, read_write> v: array<u32>;
@group(0) @binding(1) var<uniform> n: vec4<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * 65535u * 64u;
    if i < n.x {
        let x = bitcast<f32>(v[2u * i]);
        v[2u * i] = f16_bits(x);
        v[2u * i + 1u] = bitcast<u32>(to_f16(x));
    }
}
",
    ],
    entry: "main",
    bindings: &[(0, Access::ReadWrite), (1, Access::Uniform)],
};

/// Every f32 whose f16 rounding is delicate: each finite f16 value, the midpoints between
/// neighbours (ties) and one f32 step either side of them, the overflow boundary, f32 subnormals;
/// both signs.
fn f16_probe_inputs() -> Vec<f32> {
    let mut xs = Vec::new();
    for h in 0u16..0x7c00 {
        let lo = half::f16::from_bits(h).to_f64();
        let hi = half::f16::from_bits(h + 1).to_f64();
        let mid = ((lo + hi) / 2.0) as f32; // exact: f16 neighbours' midpoints fit in an f32
        xs.extend([
            lo as f32,
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ]);
    }
    xs.extend([
        65504.0,
        65519.996,
        65520.0,
        70000.0,
        1e30,
        f32::INFINITY,
        f32::MIN_POSITIVE,
    ]);
    xs.extend([
        f32::from_bits(1),
        f32::from_bits(0x7fffff),
        2f32.powi(-25),
        2f32.powi(-26),
    ]);
    let negatives: Vec<f32> = xs.iter().map(|x| -x).collect();
    xs.extend(negatives);
    xs
}

/// Whether the device's f32 -> f16 conversion rounds as math.wgsl's integer code does (to nearest,
/// ties to even, subnormals kept, overflow to infinity) on every delicate input.
pub fn probe_f16(gpu: &Gpu) -> bool {
    let xs = f16_probe_inputs();
    let words: Vec<u32> = xs.iter().flat_map(|x| [x.to_bits(), 0]).collect();
    let buf = gpu.upload(bytemuck::cast_slice(&words));
    let n = xs.len() as u32;
    let blocks = n.div_ceil(64);
    let params: Vec<u8> = bytemuck::cast_slice(&[n, 0, 0, 0]).to_vec();
    gpu.dispatch(
        &F16_PROBE,
        &[],
        &[buf.raw()],
        &params,
        [blocks.min(65535), blocks.div_ceil(65535), 1],
    );
    let got: Vec<u32> = bytemuck::pod_collect_to_vec(&gpu.read(buf.raw(), 0, buf.bytes));
    xs.iter().zip(got.chunks_exact(2)).all(|(&x, pair)| {
        let want = half::f16::from_f32(x);
        u32::from(want.to_bits()) == pair[0] && want.to_f32().to_bits() == pair[1]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str =
        "a\n//#if subgroups\nb\n//#if f16\nc\n//#else\nd\n//#endif\n//#else\ne\n//#endif\nf\n";

    fn with(subgroups: bool, f16: bool) -> String {
        preprocess(SRC, ShaderFeatures { subgroups, f16 }, Numerics::Fast)
    }

    #[test]
    fn preprocess_keeps_the_branches_of_the_features_on() {
        assert_eq!(with(false, false), "a\ne\nf\n");
        assert_eq!(with(true, false), "a\nb\nd\nf\n");
        assert_eq!(with(true, true), "enable f16;\na\nb\nc\nf\n");
        assert_eq!(with(false, true), "enable f16;\na\ne\nf\n");
    }

    #[test]
    fn exact_is_on_only_in_exact_numerics() {
        let src = "//#if exact\nint\n//#else\nnative\n//#endif\n";
        let none = ShaderFeatures::default();
        assert_eq!(preprocess(src, none, Numerics::Exact), "int\n");
        assert_eq!(preprocess(src, none, Numerics::Fast), "native\n");
    }

    #[test]
    fn probe_inputs_cover_ties_and_overflow() {
        let xs = f16_probe_inputs();
        // 1 + 2^-11 is the tie between 1 and the next f16: it must round to even (1)
        assert!(xs.contains(&(1.0 + 2f32.powi(-11))));
        assert!(xs.contains(&65520.0) && xs.contains(&-65520.0));
        assert_eq!(half::f16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
    }
}
