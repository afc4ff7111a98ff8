//! GGUF weight tensors on the device, in their block formats (dequantized inside the shaders).

use super::device::{Gpu, GpuBuffer};

/// Weight types the shaders read (quant.wgsl): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q4_K, Q5_K, Q6_K.
pub const GPU_TYPES: [u32; 11] = [0, 1, 30, 2, 3, 6, 7, 8, 12, 13, 14];

/// A matrix of `rows` rows of `cols` elements. Adapters limit what one binding may see (128 MiB on
/// some), so the rows are split into chunks that each fit one binding.
pub struct GpuWeight {
    pub ggml_type: u32,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// (buffer, first row, rows)
    pub chunks: Vec<(GpuBuffer, usize, usize)>,
}

impl GpuWeight {
    pub fn upload(
        gpu: &Gpu,
        ggml_type: u32,
        data: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, String> {
        if !GPU_TYPES.contains(&ggml_type) {
            return Err(format!("ggml type {ggml_type} has no GPU kernel"));
        }
        if rows == 0 || !data.len().is_multiple_of(rows) {
            return Err(format!(
                "{} bytes do not hold {rows} equal rows",
                data.len()
            ));
        }
        let row_bytes = data.len() / rows;
        let per_chunk = (gpu.max_binding() as usize / row_bytes).min(rows);
        if per_chunk == 0 {
            return Err(format!(
                "one row of {row_bytes} bytes exceeds the adapter's binding limit"
            ));
        }
        let chunks = (0..rows)
            .step_by(per_chunk)
            .map(|r0| {
                let n = per_chunk.min(rows - r0);
                (
                    gpu.upload(&data[r0 * row_bytes..(r0 + n) * row_bytes]),
                    r0,
                    n,
                )
            })
            .collect();
        Ok(GpuWeight {
            ggml_type,
            rows,
            cols,
            row_bytes,
            chunks,
        })
    }

    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }
}
