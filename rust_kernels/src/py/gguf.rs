//! GGUF metadata string arrays (a vocabulary: hundreds of thousands of length-prefixed UTF-8
//! strings) decoded in one call instead of one interpreted loop iteration per string.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use super::common::{contiguous, value_error};

/// `count` strings (u64 little-endian byte length, then the bytes) starting at byte `pos` of
/// `buf`: returns the list and the position after the last one. ValueError names the offset of a
/// truncated or non-UTF-8 string.
#[pyfunction]
pub fn gguf_string_array<'py>(
    py: Python<'py>,
    buf: PyReadonlyArray1<'py, u8>,
    pos: usize,
    count: usize,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let data = contiguous(&buf, "buf")?;
    let mut pos = pos;
    let mut out: Vec<Bound<'py, PyString>> = Vec::with_capacity(count.min(data.len() / 8));
    for _ in 0..count {
        let head = data.get(pos..pos.saturating_add(8)).ok_or_else(|| {
            value_error(format!(
                "truncated file inside a string array at offset {pos}"
            ))
        })?;
        let n = u64::from_le_bytes(head.try_into().expect("8 bytes"));
        pos += 8;
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| pos.checked_add(n))
            .filter(|&e| e <= data.len());
        let end = end.ok_or_else(|| {
            value_error(format!(
                "truncated file inside a string array at offset {pos}"
            ))
        })?;
        let text = std::str::from_utf8(&data[pos..end])
            .map_err(|_| value_error(format!("invalid UTF-8 in a string array at offset {pos}")))?;
        out.push(PyString::new(py, text));
        pos = end;
    }
    Ok((PyList::new(py, out)?, pos))
}
