//! Adapter selection: which backends to search, how adapters rank, the error that names what was
//! found when nothing fits.

/// How to pick an adapter.
#[derive(Clone, Debug, Default)]
pub struct AdapterChoice {
    /// "vulkan", "metal", "dx12" (None: all of them, Vulkan preferred)
    pub backend: Option<String>,
    /// a substring of the adapter's name that must match (case-insensitive)
    pub name: Option<String>,
    /// also accept software adapters (lavapipe, WARP)
    pub allow_software: bool,
    /// bind at most this many bytes of a tensor at once (tests use it to split small tensors)
    pub max_binding: Option<u64>,
    /// threads per weight row in the matmul, 1 or 8 (default: by adapter type)
    pub lanes: Option<u32>,
    /// optional features to use where the adapter has them (features.rs; None: all)
    pub features: Option<Vec<String>>,
    /// the shaders' float operations (numerics.rs)
    pub numerics: super::Numerics,
}

fn backends(name: Option<&str>) -> Result<wgpu::Backends, String> {
    Ok(match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("auto") => {
            wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12
        }
        Some("vulkan") => wgpu::Backends::VULKAN,
        Some("metal") => wgpu::Backends::METAL,
        Some("dx12") => wgpu::Backends::DX12,
        Some(other) => {
            return Err(format!(
                "unknown wgpu backend {other:?} (vulkan, metal, dx12)"
            ))
        }
    })
}

pub(crate) fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

/// Higher is better: hardware before software, discrete before integrated, Vulkan first.
fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 4,
        wgpu::DeviceType::IntegratedGpu => 3,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 1,
        wgpu::DeviceType::Cpu => 0,
    };
    (kind, u8::from(info.backend == wgpu::Backend::Vulkan))
}

/// Every adapter wgpu finds on the given backends: (description, is software).
pub fn list_adapters(backend: Option<&str>) -> Result<Vec<(String, bool)>, String> {
    let wanted = backends(backend)?;
    let instance = new_instance(wanted);
    let adapters = pollster::block_on(instance.enumerate_adapters(wanted));
    Ok(adapters
        .iter()
        .map(|a| {
            let info = a.get_info();
            (describe(&info), info.device_type == wgpu::DeviceType::Cpu)
        })
        .collect())
}

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// The best adapter that fits `choice`, or an error naming every adapter found.
pub fn pick(choice: &AdapterChoice) -> Result<wgpu::Adapter, String> {
    let wanted = backends(choice.backend.as_deref())?;
    let instance = new_instance(wanted);
    let adapters = pollster::block_on(instance.enumerate_adapters(wanted));
    let found: Vec<String> = adapters.iter().map(|a| describe(&a.get_info())).collect();
    let name = choice.name.as_ref().map(|n| n.to_ascii_lowercase());
    let best = adapters
        .into_iter()
        .filter(|a| {
            let info = a.get_info();
            (choice.allow_software || info.device_type != wgpu::DeviceType::Cpu)
                && name
                    .as_ref()
                    .is_none_or(|n| info.name.to_ascii_lowercase().contains(n))
        })
        .max_by_key(|a| rank(&a.get_info()));
    let Some(adapter) = best else {
        let seen = if found.is_empty() {
            "none".to_string()
        } else {
            found.join("; ")
        };
        let soft = if choice.allow_software {
            ""
        } else {
            " (software adapters excluded)"
        };
        return Err(format!("no GPU adapter fits{soft}; adapters found: {seen}"));
    };
    Ok(adapter)
}
