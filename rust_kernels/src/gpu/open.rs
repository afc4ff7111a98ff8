//! Opening a device (`Gpu::open`): the adapter, the device request, and the probes that decide
//! what its shaders may use: whether its `fma` is fused, and the optional features (subgroups,
//! f16) that behave exactly as their plain WGSL fallbacks (features.rs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::adapter::{self, describe, AdapterChoice};
use super::device::{Access, Gpu, Kernel};
use super::features::ShaderFeatures;
use super::recorder::Recorder;

static FMA_PROBE: Kernel = Kernel {
    name: "fma_probe",
    sources: &[
        "@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@group(0) @binding(1) var<uniform> unused: vec4<u32>;
@compute @workgroup_size(1)
fn main() {
    v[3] = fma(v[0], v[1], v[2]) + f32(unused.x);
}
",
    ],
    entry: "main",
    bindings: &[(0, Access::ReadWrite), (1, Access::Uniform)],
};

impl Gpu {
    /// Opens the best adapter that fits `choice`, or says what was found.
    pub fn open(choice: &AdapterChoice) -> Result<Gpu, String> {
        let adapter = adapter::pick(choice)?;
        let offered = ShaderFeatures::offered(choice.features.as_deref(), &adapter)?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("hyserve"),
            required_features: (adapter.features() & wgpu::Features::TIMESTAMP_QUERY)
                | offered.required(),
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| format!("{}: cannot open the device: {e}", describe(&info)))?;
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dummy"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        // written by no kernel: bound where matmul_fast_parts.wgsl has fewer parts than outputs
        let spare_out = std::array::from_fn(|_| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("spare output"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        });
        let adapter_limit = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let software = info.device_type == wgpu::DeviceType::Cpu;
        let mut gpu = Gpu {
            device,
            queue,
            info,
            binding_limit: choice
                .max_binding
                .map_or(adapter_limit, |m| m.clamp(256, adapter_limit)),
            lanes: choice.lanes.unwrap_or(if software { 1 } else { 8 }),
            pipelines: Mutex::new(HashMap::new()),
            recorder: Mutex::new(Recorder::default()),
            uniform_align: u64::from(limits.min_uniform_buffer_offset_alignment),
            limits,
            profiler: Mutex::new(None),
            pool: Arc::new(Mutex::new(HashMap::new())),
            fused_fma: true,
            features: ShaderFeatures::default(),
            numerics: choice.numerics,
            constants: Mutex::new(HashMap::new()),
            dummy,
            spare_out,
            submissions: Default::default(),
            recorded: Default::default(),
        };
        gpu.fused_fma = gpu.probe_fused_fma();
        // each feature is probed with only itself on; the probes' pipelines are never used again
        gpu.features = ShaderFeatures {
            subgroups: offered.subgroups,
            f16: false,
        };
        let subgroups = offered.subgroups && probe(&gpu, probe_subgroups);
        gpu.features = ShaderFeatures {
            subgroups: false,
            f16: offered.f16,
        };
        let f16 = offered.f16 && probe(&gpu, probe_f16);
        gpu.features = ShaderFeatures { subgroups, f16 };
        Ok(gpu)
    }

    /// Runs `fma(1 + 2^-12, 1 + 2^-12, -1)` on the device: 2^-11 + 2^-24 when fused, 2^-11 when the
    /// product is rounded first. The inputs come from a buffer so no compiler can fold them.
    fn probe_fused_fma(&self) -> bool {
        let one_plus = 1.0f32 + 2f32.powi(-12);
        let input = self.upload(bytemuck::cast_slice(&[one_plus, one_plus, -1.0f32, 0.0]));
        self.dispatch(&FMA_PROBE, &[], &[input.raw()], &[0u8; 16], [1, 1, 1]);
        let out = self.read(input.raw(), 12, 4);
        let got = f32::from_le_bytes([out[0], out[1], out[2], out[3]]);
        got == 2f32.powi(-11) + 2f32.powi(-24)
    }
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

    #[test]
    fn probe_inputs_cover_ties_and_overflow() {
        let xs = f16_probe_inputs();
        // 1 + 2^-11 is the tie between 1 and the next f16: it must round to even (1)
        assert!(xs.contains(&(1.0 + 2f32.powi(-11))));
        assert!(xs.contains(&65520.0) && xs.contains(&-65520.0));
        assert_eq!(half::f16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
    }
}
