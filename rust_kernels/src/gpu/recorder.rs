//! The device's pending work: one command encoder, one compute pass that consecutive dispatches
//! share, and the dispatches' uniform parameters packed into a few arena buffers that are written
//! once, just before the submission.
//!
//! Why: a new uniform buffer and a new compute pass per dispatch cost the host more than most
//! decode-step kernels cost the GPU (a buffer allocation plus a staging copy each). wgpu still
//! orders the dispatches of one pass (each dispatch is its own usage scope), so sharing the pass
//! changes no result.

/// Bytes of one uniform arena buffer (slots of the adapter's uniform offset alignment).
const ARENA_BYTES: u64 = 1 << 18;

#[derive(Default)]
pub struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    /// the parameters of the dispatches recorded so far, arena buffer after arena buffer
    params: Vec<u8>,
    /// kept across submissions; `queue.write_buffer` lands after the previous submission's reads
    arena: Vec<wgpu::Buffer>,
}

/// Where a dispatch's uniform parameters live in the arena.
pub struct ParamSlot {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl Recorder {
    /// The encoder, any open pass ended (copies and timed passes go straight into the encoder).
    pub fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("forward"),
            })
        })
    }

    /// The pass that untimed dispatches share, opened on first use.
    pub fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("forward"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("pass just opened")
    }

    /// A slot holding `params` (aligned to `align`), in an arena buffer that is written at submission.
    pub fn params(&mut self, device: &wgpu::Device, align: u64, params: &[u8]) -> ParamSlot {
        let size = (params.len() as u64).next_multiple_of(16).max(16);
        let mut start = (self.params.len() as u64).next_multiple_of(align);
        if start % ARENA_BYTES + size > ARENA_BYTES {
            start = start.next_multiple_of(ARENA_BYTES); // never straddle two arena buffers
        }
        self.params.resize(start as usize, 0);
        self.params.extend_from_slice(params);
        self.params.resize((start + size) as usize, 0);
        let index = (start / ARENA_BYTES) as usize;
        while self.arena.len() <= index {
            self.arena
                .push(device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("uniform arena"),
                    size: ARENA_BYTES,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
        }
        ParamSlot {
            buffer: self.arena[index].clone(),
            offset: start % ARENA_BYTES,
            size,
        }
    }

    /// Everything recorded, ready to finish and submit: the pass ended and the arena written
    /// (the write lands before the submission that follows). None when nothing was recorded.
    pub fn take(&mut self, queue: &wgpu::Queue) -> Option<wgpu::CommandEncoder> {
        self.pass = None;
        for (i, chunk) in self.params.chunks(ARENA_BYTES as usize).enumerate() {
            queue.write_buffer(&self.arena[i], 0, chunk);
        }
        self.params.clear();
        self.encoder.take()
    }

    /// Drops the recorded work unrun.
    pub fn discard(&mut self) {
        self.pass = None;
        self.params.clear();
        self.encoder = None;
    }
}
