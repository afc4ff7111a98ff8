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
//! (`open.rs`). Shader variants are chosen by a tiny preprocessor: `//#if NAME`, `//#else`,
//! `//#endif` lines in the WGSL sources, NAME a feature or `exact` (the numerics mode, numerics.rs).

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
}
