//! Python binding of the SentencePiece tokenizer (`spm`): built once per model, encode releases the GIL.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::spm::SpmVocab as Vocab;
use crate::{contiguous, value_error};

/// llama.cpp's SPM tokenizer over a vocabulary: `SpmVocab(tokens, joined, scores, byte_tokens)`,
/// where `joined` is `"".join(tokens)` (one UTF-8 conversion instead of one per token) and
/// `byte_tokens[b]` is the token for byte `b` when a character is no token (-1: none).
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct SpmVocab {
    inner: Vocab,
}

#[pymethods]
impl SpmVocab {
    #[new]
    fn new(
        tokens: &Bound<'_, PyList>,
        joined: &str,
        scores: PyReadonlyArray1<'_, f32>,
        byte_tokens: Vec<i64>,
    ) -> PyResult<Self> {
        if byte_tokens.len() != 256 {
            return Err(value_error("byte_tokens must have 256 entries"));
        }
        let mut table = [None; 256];
        for (slot, &id) in table.iter_mut().zip(&byte_tokens) {
            *slot = u32::try_from(id).ok();
        }
        // split `joined` at the tokens' lengths in characters
        let mut chars = joined
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(joined.len()));
        let mut start = chars.next().unwrap_or(0);
        let mut texts: Vec<&str> = Vec::with_capacity(tokens.len());
        for item in tokens.iter() {
            let n = item.len()?;
            let end = if n == 0 {
                start
            } else {
                chars
                    .nth(n - 1)
                    .ok_or_else(|| value_error("joined is shorter than the tokens"))?
            };
            texts.push(&joined[start..end]);
            start = end;
        }
        if start != joined.len() {
            return Err(value_error("joined is longer than the tokens"));
        }
        let scores = contiguous(&scores, "scores")?;
        let inner = Vocab::new(&texts, scores, table).map_err(value_error)?;
        Ok(Self { inner })
    }

    /// `(ids, char_offsets)` of `text`; ValueError when a character needs a byte token the
    /// vocabulary lacks.
    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<(Vec<u32>, Vec<u32>)> {
        py.detach(|| self.inner.encode(text)).map_err(value_error)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}
