//! Captured forwards: the dispatches and copies that one thread records between `begin_capture`
//! and `end_capture` become a `Plan`, which `replay` records again in one call, as CUDA graphs
//! replay a captured stream. A decode step then costs the host one call instead of a Python call,
//! a bind group and a parameter upload per operation.
//!
//! What makes a replay compute the next step rather than the captured one: its inputs are written
//! in place before it (token ids, positions and the RoPE tables made from them), every other
//! buffer it binds is either the model's (weights, K/V caches and recurrent states, whose
//! identities stay fixed) or its own (intermediates from the capture's own pool, so no other work
//! ever shares them), and no parameter depends on the step (attention reads the
//! cache positions from the positions buffer). Anything a plan cannot repeat (a host write, a
//! submission or a timed dispatch inside the capture) spoils it: `end_capture` then says why, and
//! the captured step itself still ran correctly.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, ThreadId};

use super::device::{record, Gpu, Pipeline, Pool};
use super::recorder::Arena;

/// One recorded command of a plan.
pub(super) enum Command {
    Dispatch {
        pipeline: Arc<Pipeline>,
        bind_group: wgpu::BindGroup,
        groups: [u32; 3],
    },
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    },
}

/// A capture under way on one thread (other threads' work is recorded as usual, not captured).
pub struct Capture {
    thread: ThreadId,
    commands: Vec<Command>,
    pub(super) arena: Arena,
    /// the buffers the capture allocates and frees (its intermediates), reused only within it
    pub(super) pool: Pool,
    spoiled: Option<String>,
}

impl Capture {
    pub(super) fn is_here(&self) -> bool {
        self.thread == thread::current().id()
    }

    pub(super) fn push(&mut self, command: Command) {
        self.commands.push(command);
    }

    /// Marks the capture as not repeatable (the first reason is kept).
    pub(super) fn spoil(&mut self, why: &str) {
        self.spoiled.get_or_insert_with(|| why.to_string());
    }
}

/// A captured forward: its commands, and the parameter arena they bind (written once).
pub struct Plan {
    commands: Vec<Command>,
    _arena: Vec<wgpu::Buffer>,
}

impl Plan {
    /// (dispatches, copies) a replay records.
    pub fn counts(&self) -> (usize, usize) {
        let dispatches = self
            .commands
            .iter()
            .filter(|c| matches!(c, Command::Dispatch { .. }))
            .count();
        (dispatches, self.commands.len() - dispatches)
    }
}

impl Gpu {
    /// Starts capturing the calling thread's dispatches and copies (they still run as usual).
    pub fn begin_capture(&self) -> Result<(), String> {
        let mut recorder = self.recorder.lock().unwrap();
        if recorder.capture.is_some() {
            return Err("another capture is under way on this device".into());
        }
        if self.profiler.lock().unwrap().is_some() {
            return Err("timed dispatches cannot be captured".into());
        }
        recorder.capture = Some(Capture {
            thread: thread::current().id(),
            commands: Vec::new(),
            arena: Arena::default(),
            pool: Pool::default(),
            spoiled: None,
        });
        Ok(())
    }

    /// Ends the calling thread's capture: its plan, or why it cannot be replayed. Either way the
    /// captured work, still pending, runs correctly when submitted.
    pub fn end_capture(&self) -> Result<Plan, String> {
        let mut recorder = self.recorder.lock().unwrap();
        let capture = recorder
            .capture
            .take_if(|c| c.is_here())
            .ok_or("no capture under way on this thread")?;
        capture.arena.write_kept(&self.queue);
        if let Some(why) = capture.spoiled {
            return Err(why);
        }
        Ok(Plan {
            commands: capture.commands,
            _arena: capture.arena.into_buffers(),
        })
    }

    /// Whether the calling thread is capturing.
    pub fn capturing_here(&self) -> bool {
        self.recorder.lock().unwrap().capture_here().is_some()
    }

    /// Records a plan's commands into the pending encoder, in one call.
    pub fn replay(&self, plan: &Plan) {
        let mut recorder = self.recorder.lock().unwrap();
        if let Some(capture) = recorder.capture_here() {
            capture.spoil("a replay inside a capture");
        }
        self.recorded.fetch_add(1, Ordering::Relaxed);
        for command in &plan.commands {
            match command {
                Command::Dispatch {
                    pipeline,
                    bind_group,
                    groups,
                } => record(recorder.pass(&self.device), pipeline, bind_group, *groups),
                Command::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    bytes,
                } => recorder.encoder(&self.device).copy_buffer_to_buffer(
                    src,
                    *src_offset,
                    dst,
                    *dst_offset,
                    *bytes,
                ),
            }
        }
    }
}
