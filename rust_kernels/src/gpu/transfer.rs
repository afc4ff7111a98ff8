//! Transfers between the host and the device: uploads, writes into live buffers and read-backs
//! (several ranges with one submission and one wait).

use wgpu::util::DeviceExt;

use super::device::{Gpu, GpuBuffer};

impl Gpu {
    /// A new buffer holding `data` (never a pooled one: work already recorded may still read those;
    /// nor does it join the pool when dropped: its size is the data's).
    pub fn upload(&self, data: &[u8]) -> GpuBuffer {
        let mut padded = data.to_vec();
        padded.resize(data.len().max(16).next_multiple_of(4), 0);
        let buffer = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("upload"),
                contents: &padded,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            });
        GpuBuffer {
            buffer: Some(buffer),
            pool: None,
            bytes: data.len() as u64,
        }
    }

    /// Writes host bytes into a live buffer at `offset`, after all work recorded so far.
    pub fn write(&self, dst: &wgpu::Buffer, offset: u64, data: &[u8]) {
        self.recorded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(capture) = self.recorder.lock().unwrap().capture_here() {
            capture.spoil("a host write inside the forward");
        }
        self.flush();
        let mut padded = data.to_vec();
        padded.resize(data.len().next_multiple_of(4), 0);
        self.queue.write_buffer(dst, offset, &padded);
    }

    /// Runs everything recorded and reads `bytes` of `src` from `offset` back to the host.
    pub fn read(&self, src: &wgpu::Buffer, offset: u64, bytes: u64) -> Vec<u8> {
        self.read_many(&[(src, offset, bytes)])
            .pop()
            .expect("one read, one result")
    }

    /// Runs everything recorded and reads several ranges `(buffer, offset, bytes)` back with one
    /// submission and one wait: a forward's logits and its kept recurrent inputs come back
    /// together instead of a round trip each (each costs the GPU an idle gap).
    pub fn read_many(&self, srcs: &[(&wgpu::Buffer, u64, u64)]) -> Vec<Vec<u8>> {
        let starts: Vec<u64> = srcs
            .iter()
            .scan(0u64, |at, &(_, _, bytes)| {
                let start = *at;
                *at += bytes.next_multiple_of(4);
                Some(start)
            })
            .collect();
        let total: u64 = srcs.iter().map(|s| s.2.next_multiple_of(4)).sum();
        if total == 0 {
            self.flush();
            return srcs.iter().map(|_| Vec::new()).collect();
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read-back"),
            size: total,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for (&(src, offset, bytes), &start) in srcs.iter().zip(&starts) {
            self.copy(src, offset, &staging, start, bytes.next_multiple_of(4));
        }
        self.flush();
        let slice = staging.slice(..);
        slice.map_async(wgpu::MapMode::Read, |r| r.expect("map read-back buffer"));
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .expect("device poll");
        let mapped = slice.get_mapped_range().expect("mapped read-back range");
        let out = srcs
            .iter()
            .zip(&starts)
            .map(|(&(_, _, bytes), &start)| {
                mapped[start as usize..(start + bytes) as usize].to_vec()
            })
            .collect();
        drop(mapped);
        staging.unmap();
        out
    }
}
