//! Python bindings of the vocabulary lookup (`token_table`) and the SentencePiece tokenizer
//! (`spm`): built once per model; encode releases the GIL.

use std::sync::Arc;

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::common::{contiguous, value_error};
use crate::spm::SpmVocab as Vocab;
use crate::token_table::TokenTable;

/// A vocabulary's text -> id lookup: `TokenIndex(tokens, "".join(tokens))` (one UTF-8 conversion
/// instead of one per token). A repeated text keeps its first id; `distinct` counts the texts.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct TokenIndex {
    table: Arc<TokenTable>,
}

#[pymethods]
impl TokenIndex {
    #[new]
    fn new(tokens: &Bound<'_, PyList>, joined: &str) -> PyResult<Self> {
        let lens = tokens
            .iter()
            .map(|t| t.len())
            .collect::<PyResult<Vec<usize>>>()?;
        let table = TokenTable::new(joined.to_owned(), &lens).map_err(value_error)?;
        Ok(Self {
            table: Arc::new(table),
        })
    }

    #[pyo3(signature = (text, default=None))]
    fn get(&self, text: &Bound<'_, PyAny>, default: Option<u32>) -> Option<u32> {
        match text.extract::<&str>() {
            Ok(t) => self.table.get(t).or(default),
            Err(_) => default, // not a str, or one with lone surrogates: no token has that text
        }
    }

    fn __contains__(&self, text: &Bound<'_, PyAny>) -> bool {
        self.get(text, None).is_some()
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }

    #[getter]
    fn distinct(&self) -> usize {
        self.table.distinct()
    }
}

/// llama.cpp's SPM tokenizer over a vocabulary: `SpmVocab(index, scores, byte_tokens)`, where
/// `byte_tokens[b]` is the token for byte `b` when a character is no token (-1: none).
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct SpmVocab {
    inner: Vocab,
}

#[pymethods]
impl SpmVocab {
    #[new]
    fn new(
        index: &TokenIndex,
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
        let scores = contiguous(&scores, "scores")?;
        let inner = Vocab::new(Arc::clone(&index.table), scores, table).map_err(value_error)?;
        Ok(Self { inner })
    }

    /// `(ids, char_offsets)` of `text`; ValueError when a character needs a byte token the
    /// vocabulary lacks.
    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<(Vec<u32>, Vec<u32>)> {
        py.detach(|| self.inner.encode(text)).map_err(value_error)
    }
}
