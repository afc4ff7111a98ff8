//! Quantized activation blocks: what the activation quantizers (`act.rs`, `act_avx2.rs`) produce and
//! the dot products (`legacy.rs`, `kquants.rs`, `avx2.rs`) consume. Plain data, no code.

#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f32,
    pub qs: [i8; 32],
}

/// A `BlockQ8_0` with its quants + 128 as unsigned bytes (`u = q ^ 0x80`), the form the VNNI
/// kernels of several rows read (`int_dots::biased_sums_start`); the same size, so reading it
/// instead of the block costs no cache.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ8_0Biased {
    pub d: f32,
    pub u: [u8; 32],
}

#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f32,
    /// f16(d_unrounded * sum(qs)), as llama.cpp stores it
    pub s: f32,
    pub qs: [i8; 32],
}

#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
    /// Sums of the 32-element sub-blocks (`bsums[2k] + bsums[2k+1]`), which the multi-row Q4_K/Q5_K
    /// kernels would otherwise recompute for every weight row.
    pub psums: [i16; 8],
}
