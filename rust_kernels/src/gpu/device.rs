//! The device and its queue, pipelines, the buffer pool, the pending encoder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::adapter::describe;
use super::capture::Command;
use super::features::{self, ShaderFeatures};
use super::profile::Profiler;
use super::recorder::Recorder;
use super::Numerics;

/// Access of one binding of a kernel, in binding order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
    Uniform,
}

/// A compute kernel: a WGSL entry point, the library sources it needs, its bindings.
pub struct Kernel {
    pub name: &'static str,
    pub sources: &'static [&'static str],
    pub entry: &'static str,
    /// (binding number, access)
    pub bindings: &'static [(u32, Access)],
}

/// Pipelines by kernel name, then by override constants (a short list, searched without allocating).
type PipelineCache = HashMap<&'static str, Vec<(Vec<(&'static str, u32)>, Arc<Pipeline>)>>;

pub(crate) struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// Free device buffers by size (powers of two).
pub(super) type Pool = Arc<Mutex<HashMap<u64, Vec<wgpu::Buffer>>>>;

/// A device buffer; one from the pool goes back to it when dropped. Work already recorded that
/// reads it still runs in order before any later reuse (wgpu orders dispatches).
pub struct GpuBuffer {
    pub(super) buffer: Option<wgpu::Buffer>,
    pub(super) pool: Option<Pool>,
    pub bytes: u64,
}

impl GpuBuffer {
    pub fn raw(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("live buffer")
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let (Some(b), Some(pool)) = (self.buffer.take(), &self.pool) {
            if let Ok(mut pool) = pool.lock() {
                pool.entry(b.size()).or_default().push(b);
            }
        }
    }
}

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub(super) binding_limit: u64,
    pub(super) lanes: u32,
    pub(super) pipelines: Mutex<PipelineCache>,
    /// the pending encoder, its open pass and the dispatches' parameters
    pub(super) recorder: Mutex<Recorder>,
    /// the adapter's alignment of uniform binding offsets
    pub(super) uniform_align: u64,
    /// timestamp queries per dispatch while profiling (profile.rs)
    pub(crate) profiler: Mutex<Option<Profiler>>,
    pub(super) pool: Pool,
    /// whether the adapter's WGSL `fma` rounds once (math.wgsl's FUSED_FMA)
    pub(super) fused_fma: bool,
    /// the optional features the shaders use (features.rs)
    pub(super) features: ShaderFeatures,
    /// the shaders' float operations (numerics.rs)
    pub(super) numerics: Numerics,
    /// read-only tables uploaded once per device (by name)
    pub(super) constants: Mutex<HashMap<&'static str, Arc<GpuBuffer>>>,
    /// bound where a kernel declares a binding that an operation does not use
    pub dummy: wgpu::Buffer,
    /// bound to a kernel's unused outputs (three, so no two writable bindings share a buffer)
    pub spare_out: [wgpu::Buffer; 3],
    /// queue submissions so far (a decode step's count is a test's subject)
    pub(super) submissions: AtomicU64,
    /// the commands (dispatches, copies, host writes) recorded so far, on any thread
    pub(super) recorded: AtomicU64,
}

impl Gpu {
    /// The optional features in use (those asked for that the adapter has and that passed their
    /// probes).
    pub fn features(&self) -> ShaderFeatures {
        self.features
    }

    /// The shaders' numerics mode.
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// The device copy of a constant table, uploaded on first use.
    pub fn constant(&self, name: &'static str, bytes: impl FnOnce() -> Vec<u8>) -> Arc<GpuBuffer> {
        let mut tables = self.constants.lock().unwrap();
        tables
            .entry(name)
            .or_insert_with(|| Arc::new(self.upload(&bytes())))
            .clone()
    }

    /// Whether the adapter's `fma` is fused; where it is not, shaders compute it in integers.
    pub fn fused_fma(&self) -> bool {
        self.fused_fma
    }

    pub fn describe(&self) -> String {
        describe(&self.info)
    }

    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Threads per weight row in the matmul (each the CPU's float lanes 8 / lanes): 8 on GPUs, 1 on
    /// software adapters, where a barrier costs more than the work it shares. Same bits either way.
    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    /// The largest buffer one binding may see.
    pub fn max_binding(&self) -> u64 {
        self.binding_limit
    }

    fn pipeline(&self, k: &Kernel, constants: &[(&'static str, u32)]) -> Arc<Pipeline> {
        let mut cache = self.pipelines.lock().unwrap();
        let variants = cache.entry(k.name).or_default();
        if let Some((_, p)) = variants.iter().find(|(c, _)| c == constants) {
            return p.clone();
        }
        let source = features::preprocess(&k.sources.concat(), self.features, self.numerics);
        let wants_fma = source.contains("override FUSED_FMA");
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(k.name),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let entries: Vec<wgpu::BindGroupLayoutEntry> = k
            .bindings
            .iter()
            .map(|&(binding, access)| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match access {
                        Access::Uniform => wgpu::BufferBindingType::Uniform,
                        Access::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Access::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let layout = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(k.name),
                entries: &entries,
            });
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(k.name),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let mut consts: Vec<(&str, f64)> =
            constants.iter().map(|&(n, v)| (n, f64::from(v))).collect();
        if wants_fma {
            consts.push(("FUSED_FMA", f64::from(u32::from(self.fused_fma))));
        }
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(k.name),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(k.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &consts,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        let p = Arc::new(Pipeline { pipeline, layout });
        variants.push((constants.to_vec(), p.clone()));
        p
    }

    /// Records one dispatch of `k` into the pending encoder. `buffers` follow the kernel's storage
    /// bindings in order; `params` fills its uniform binding.
    pub fn dispatch(
        &self,
        k: &Kernel,
        constants: &[(&'static str, u32)],
        buffers: &[&wgpu::Buffer],
        params: &[u8],
        groups: [u32; 3],
    ) {
        if groups.contains(&0) {
            return;
        }
        let p = self.pipeline(k, constants);
        let mut recorder = self.recorder.lock().unwrap();
        self.recorded.fetch_add(1, Ordering::Relaxed);
        let slot = recorder.params(&self.device, self.uniform_align, params);
        let mut storage = buffers.iter();
        let entries: Vec<wgpu::BindGroupEntry> = k
            .bindings
            .iter()
            .map(|&(binding, access)| wgpu::BindGroupEntry {
                binding,
                resource: match access {
                    Access::Uniform => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &slot.buffer,
                        offset: slot.offset,
                        size: wgpu::BufferSize::new(slot.size),
                    }),
                    _ => storage
                        .next()
                        .expect("a buffer for every storage binding")
                        .as_entire_binding(),
                },
            })
            .collect();
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.name),
            layout: &p.layout,
            entries: &entries,
        });
        if let Some(capture) = recorder.capture_here() {
            capture.push(Command::Dispatch {
                pipeline: p.clone(),
                bind_group: bind_group.clone(),
                groups,
            });
        }
        let mut profiler = self.profiler.lock().unwrap();
        if let Some(timestamps) = profiler.as_mut().and_then(|p| p.next(k.name)) {
            // a timed dispatch has a pass of its own, whose start and end the queries mark
            let mut pass =
                recorder
                    .encoder(&self.device)
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(k.name),
                        timestamp_writes: Some(timestamps),
                    });
            record(&mut pass, &p, &bind_group, groups);
        } else {
            record(recorder.pass(&self.device), &p, &bind_group, groups);
        }
    }

    /// A pooled device buffer of at least `bytes` (sizes round up to powers of two, so a few
    /// sizes serve every shape). Its contents are undefined.
    /// While this thread captures a forward, its buffers come from the capture's own pool: a
    /// plan's intermediates are reused within the plan as within a forward, never by other work.
    pub fn alloc(&self, bytes: u64) -> GpuBuffer {
        let size = bytes.max(16).next_power_of_two();
        let capture_pool = self
            .recorder
            .lock()
            .unwrap()
            .capture_here()
            .map(|c| c.pool.clone());
        let pool = capture_pool.unwrap_or_else(|| self.pool.clone());
        let reused = pool.lock().unwrap().get_mut(&size).and_then(Vec::pop);
        let buffer = reused.unwrap_or_else(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tensor"),
                size,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        GpuBuffer {
            buffer: Some(buffer),
            pool: Some(pool),
            bytes,
        }
    }

    /// Records a device-to-device copy (sizes and offsets multiples of 4).
    pub fn copy(
        &self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        if bytes == 0 {
            return;
        }
        let mut recorder = self.recorder.lock().unwrap();
        self.recorded.fetch_add(1, Ordering::Relaxed);
        if let Some(capture) = recorder.capture_here() {
            capture.push(Command::Copy {
                src: src.clone(),
                src_offset,
                dst: dst.clone(),
                dst_offset,
                bytes,
            });
        }
        recorder
            .encoder(&self.device)
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
    }

    /// Commands recorded since the device opened: a result made by the last one is still as that
    /// command left it while this count has not moved.
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    /// Queue submissions since the device opened.
    pub fn submissions(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    /// Submits everything recorded so far.
    pub fn flush(&self) {
        // the recorder stays locked until the submission: the arena written for this encoder must
        // not be overwritten by another thread's recording before its work is submitted
        let mut recorder = self.recorder.lock().unwrap();
        if let Some(capture) = recorder.capture_here() {
            capture.spoil("a submission inside the forward");
        }
        if let Some(mut encoder) = recorder.take(&self.queue) {
            let mut profiler = self.profiler.lock().unwrap();
            let timed = profiler.as_ref().is_some_and(|p| p.resolve(&mut encoder));
            self.queue.submit([encoder.finish()]);
            self.submissions.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = profiler.as_mut().filter(|_| timed) {
                p.collect(&self.device, &self.queue);
            }
        }
    }

    /// Drops the recorded work unrun (a cancelled or failed forward call).
    pub fn discard(&self) {
        self.recorder.lock().unwrap().discard();
        if let Some(p) = self.profiler.lock().unwrap().as_mut() {
            p.forget();
        }
    }
}

/// Profiling: timestamp queries per dispatch (`profile.rs`).
impl Gpu {
    /// Whether the adapter can time passes (`TIMESTAMP_QUERY`).
    pub fn has_timestamps(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Starts (or stops) timing every dispatch; work recorded so far is submitted first.
    pub fn set_profiling(&self, on: bool) -> Result<(), String> {
        if on && !self.has_timestamps() {
            return Err(format!(
                "{}: no timestamp queries on this adapter",
                self.describe()
            ));
        }
        self.flush();
        let mut p = self.profiler.lock().unwrap();
        if !on {
            *p = None;
        } else if p.is_none() {
            *p = Some(Profiler::new(&self.device));
        }
        Ok(())
    }

    /// Seconds and passes per kernel name since the last call (submitting recorded work), and
    /// the passes that were not timed.
    pub fn take_profile(&self) -> (HashMap<&'static str, (f64, u64)>, u64) {
        self.flush();
        self.profiler
            .lock()
            .unwrap()
            .as_mut()
            .map_or_else(|| (HashMap::new(), 0), Profiler::take)
    }
}

pub(super) fn record(
    pass: &mut wgpu::ComputePass,
    p: &Pipeline,
    bind_group: &wgpu::BindGroup,
    groups: [u32; 3],
) {
    pass.set_pipeline(&p.pipeline);
    pass.set_bind_group(0, bind_group, &[]);
    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
}
