//! Timestamp queries per dispatch, on adapters with `TIMESTAMP_QUERY`: while profiling is on,
//! each compute pass writes its start and end ticks; when the pending work is submitted they are
//! resolved, read back (a sync: profiling only) and summed per kernel name.

use std::collections::HashMap;

/// The most passes one submission times (two queries each; wgpu allows 4096 queries a set).
const PASSES: u32 = 2048;

pub struct Profiler {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// kernel names of the timed passes in the pending encoder, in order
    names: Vec<&'static str>,
    /// seconds and passes per kernel name since the last `take`
    totals: HashMap<&'static str, (f64, u64)>,
    /// passes recorded past `PASSES` in one submission (not timed)
    untimed: u64,
}

impl Profiler {
    pub fn new(device: &wgpu::Device) -> Self {
        let bytes = u64::from(2 * PASSES) * 8;
        Profiler {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * PASSES,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps resolved"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            staging: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps read-back"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            names: Vec::new(),
            totals: HashMap::new(),
            untimed: 0,
        }
    }

    /// Where the next pass (kernel `name`) writes its timestamps, if there is room.
    pub fn next(&mut self, name: &'static str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let i = self.names.len() as u32;
        if i >= PASSES {
            self.untimed += 1;
            return None;
        }
        self.names.push(name);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Records the resolve of this submission's timestamps at the end of `encoder`.
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) -> bool {
        let n = 2 * self.names.len() as u32;
        if n == 0 {
            return false;
        }
        encoder.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, u64::from(n) * 8);
        true
    }

    /// After the submission ran: adds its passes' durations to the totals.
    pub fn collect(&mut self, device: &wgpu::Device, queue: &wgpu::Queue) {
        let n = 2 * self.names.len() as u64;
        if n == 0 {
            return;
        }
        let slice = self.staging.slice(..n * 8);
        slice.map_async(wgpu::MapMode::Read, |r| r.expect("map timestamps"));
        device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .expect("device poll");
        let data = slice
            .get_mapped_range()
            .expect("mapped timestamps")
            .to_vec();
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&data);
        self.staging.unmap();
        let period = f64::from(queue.get_timestamp_period()) * 1e-9;
        for (name, t) in self.names.drain(..).zip(ticks.chunks_exact(2)) {
            let e = self.totals.entry(name).or_default();
            e.0 += t[1].saturating_sub(t[0]) as f64 * period;
            e.1 += 1;
        }
    }

    /// Drops the names of passes whose work was discarded unrun.
    pub fn forget(&mut self) {
        self.names.clear();
    }

    /// The totals since the last call, and the passes that could not be timed.
    pub fn take(&mut self) -> (HashMap<&'static str, (f64, u64)>, u64) {
        (
            std::mem::take(&mut self.totals),
            std::mem::take(&mut self.untimed),
        )
    }
}
