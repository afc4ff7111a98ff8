//! The two numerics modes of the shaders, chosen when a device opens.
//!
//! - `Fast` (the default): the adapter's own `fma`, `/`, `sqrt`, `exp` and f16 conversions, and
//!   f32 sums where the CPU sums in f64. Every kernel keeps one fixed order of operations per
//!   output and no float atomics, so results are the same bits run after run and a row's bits never
//!   depend on its batch or on how its prompt was chunked; they differ from the CPU's in the last
//!   bits (mean KL against the CPU within 1e-3, tested on every architecture).
//! - `Exact`: the CPU kernels' results bit for bit where the shaders can follow them (math.wgsl
//!   computes the float operations that WGSL leaves to the adapter in integers, f64.wgsl emulates
//!   the CPU's f64 sums): the agreement tests' mode, and a third of the GPU time of a decode step.
//!
//! The shaders hold both as `//#if exact` / `//#else` blocks (features.rs's preprocessor).

/// Which float operations the shaders use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    #[default]
    Fast,
    Exact,
}

/// The modes by name, as `--gpu-numerics` and `GpuDevice(numerics=...)` spell them.
pub const NAMES: [&str; 2] = ["fast", "exact"];

impl Numerics {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name.to_ascii_lowercase().as_str() {
            "fast" => Ok(Self::Fast),
            "exact" => Ok(Self::Exact),
            other => Err(format!(
                "unknown GPU numerics {other:?} (choose from {})",
                NAMES.join(", ")
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Exact => "exact",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for name in NAMES {
            assert_eq!(Numerics::parse(name).unwrap().name(), name);
        }
        assert_eq!(Numerics::parse("EXACT"), Ok(Numerics::Exact));
        assert!(Numerics::parse("bitwise")
            .unwrap_err()
            .contains("fast, exact"));
    }
}
