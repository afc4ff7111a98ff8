//! The device's pending work: one command encoder, one compute pass that consecutive dispatches
//! share, and the dispatches' uniform parameters packed into a few arena buffers that are written
//! once, just before the submission. While a forward is captured (`capture.rs`), the capturing
//! thread's parameters go to the plan's own arena instead, written once for every replay.
//!
//! Why: a new uniform buffer and a new compute pass per dispatch cost the host more than most
//! decode-step kernels cost the GPU (a buffer allocation plus a staging copy each). wgpu still
//! orders the dispatches of one pass (each dispatch is its own usage scope), so sharing the pass
//! changes no result.

use super::capture::Capture;

/// Bytes of one uniform arena buffer (slots of the adapter's uniform offset alignment).
const ARENA_BYTES: u64 = 1 << 18;

/// Uniform parameters packed into arena buffers, written to the device in one go.
#[derive(Default)]
pub struct Arena {
    bytes: Vec<u8>,
    /// kept across submissions; `queue.write_buffer` lands after the previous submission's reads
    buffers: Vec<wgpu::Buffer>,
}

/// Where a dispatch's uniform parameters live in an arena.
pub struct ParamSlot {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl Arena {
    /// A slot holding `params` (aligned to `align`), written by the next `write`.
    pub fn slot(&mut self, device: &wgpu::Device, align: u64, params: &[u8]) -> ParamSlot {
        let size = (params.len() as u64).next_multiple_of(16).max(16);
        let mut start = (self.bytes.len() as u64).next_multiple_of(align);
        if start % ARENA_BYTES + size > ARENA_BYTES {
            start = start.next_multiple_of(ARENA_BYTES); // never straddle two arena buffers
        }
        self.bytes.resize(start as usize, 0);
        self.bytes.extend_from_slice(params);
        self.bytes.resize((start + size) as usize, 0);
        let index = (start / ARENA_BYTES) as usize;
        while self.buffers.len() <= index {
            self.buffers
                .push(device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("uniform arena"),
                    size: ARENA_BYTES,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
        }
        ParamSlot {
            buffer: self.buffers[index].clone(),
            offset: start % ARENA_BYTES,
            size,
        }
    }

    /// Writes the slots handed out since the last write (it lands before the next submission)
    /// and starts over.
    pub fn write(&mut self, queue: &wgpu::Queue) {
        self.write_kept(queue);
        self.bytes.clear();
    }

    /// Writes every slot handed out so far, keeping them (a capture's arena, written again whole
    /// when the capture ends).
    pub fn write_kept(&self, queue: &wgpu::Queue) {
        for (i, chunk) in self.bytes.chunks(ARENA_BYTES as usize).enumerate() {
            queue.write_buffer(&self.buffers[i], 0, chunk);
        }
    }

    /// The arena's buffers (a captured plan keeps its own alive).
    pub fn into_buffers(self) -> Vec<wgpu::Buffer> {
        self.buffers
    }
}

#[derive(Default)]
pub struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    /// the parameters of the dispatches recorded so far
    arena: Arena,
    /// a forward being captured into a plan, by one thread
    pub(super) capture: Option<Capture>,
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

    /// A slot holding `params` (aligned to `align`): in the capture's arena on the capturing
    /// thread, else in the arena written at submission.
    pub fn params(&mut self, device: &wgpu::Device, align: u64, params: &[u8]) -> ParamSlot {
        match self.capture.as_mut().filter(|c| c.is_here()) {
            Some(capture) => capture.arena.slot(device, align, params),
            None => self.arena.slot(device, align, params),
        }
    }

    /// The capture that the calling thread records into, if any.
    pub fn capture_here(&mut self) -> Option<&mut Capture> {
        self.capture.as_mut().filter(|c| c.is_here())
    }

    /// Everything recorded, ready to finish and submit: the pass ended and the arena written
    /// (the write lands before the submission that follows). None when nothing was recorded.
    pub fn take(&mut self, queue: &wgpu::Queue) -> Option<wgpu::CommandEncoder> {
        self.pass = None;
        self.arena.write(queue);
        if let Some(capture) = &self.capture {
            capture.arena.write_kept(queue); // its dispatches so far are in this submission
        }
        self.encoder.take()
    }

    /// Drops the recorded work unrun.
    pub fn discard(&mut self) {
        self.pass = None;
        self.arena.bytes.clear();
        self.encoder = None;
    }
}
