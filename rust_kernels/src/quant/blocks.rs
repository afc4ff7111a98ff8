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

/// Quants first and the block 64-byte aligned: the multi-row K-quant kernels load every row's
/// quants 32 or 64 bytes at a time, and with the quants at offset 4 of a 308-byte block about half
/// of those loads crossed a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct BlockQ8K {
    pub qs: [i8; 256],
    pub d: f32,
    pub bsums: [i16; 16],
    /// Sums of the 32-element sub-blocks (`bsums[2k] + bsums[2k+1]`), which the multi-row Q4_K/Q5_K
    /// kernels would otherwise recompute for every weight row.
    pub psums: [i16; 8],
}
