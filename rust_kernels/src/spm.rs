//! SentencePiece (`llama` vocabulary) tokenization as llama.cpp's `llm_tokenizer_spm` does it.
//!
//! The text (spaces already replaced by `▁`) starts as one symbol per UTF-8 character; every
//! adjacent pair whose concatenation is a token goes into a queue ordered by that token's score
//! (highest first, ties to the leftmost pair); the best pair is merged and its new neighbours are
//! queued, until the queue is empty. A final symbol that is a token becomes that token; one that is
//! not (a character outside the vocabulary) becomes one byte token per UTF-8 byte. Only the
//! vocabulary's text -> (id, score) map is needed, so building it at load time is cheap.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::token_table::TokenTable;

/// The vocabulary as the SPM tokenizer needs it.
pub struct SpmVocab {
    table: Arc<TokenTable>,
    scores: Vec<f32>,
    /// llama.cpp's `byte_to_token` for each byte value; None when the vocabulary has no token for it
    byte_tokens: [Option<u32>; 256],
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize, // byte offset in the text
    len: usize,   // bytes; 0 once merged into its left neighbour
    ch: u32,      // character index of `start` (what Python offsets count)
    prev: isize,
    next: isize,
}

#[derive(PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// A max-heap pops the highest score first and, among equal scores, the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl SpmVocab {
    /// Token `i` of `table` has score `scores[i]`.
    pub fn new(
        table: Arc<TokenTable>,
        scores: &[f32],
        byte_tokens: [Option<u32>; 256],
    ) -> Result<Self, String> {
        if table.len() != scores.len() {
            return Err(format!(
                "{} tokens but {} scores",
                table.len(),
                scores.len()
            ));
        }
        Ok(Self {
            table,
            scores: scores.to_vec(),
            byte_tokens,
        })
    }

    /// Token ids of `text` and, for each, the index of the character it starts at.
    pub fn encode(&self, text: &str) -> Result<(Vec<u32>, Vec<u32>), String> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (ch, (start, c)) in text.char_indices().enumerate() {
            let i = symbols.len() as isize;
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                ch: ch as u32,
                prev: i - 1,
                next: i + 1,
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = -1;
        }
        let mut queue = BinaryHeap::with_capacity(symbols.len());
        for i in 1..symbols.len() {
            self.try_add(text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // a pair one of whose symbols changed since it was queued is stale
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.left].next = r.next;
            symbols[b.right].len = 0;
            if r.next >= 0 {
                symbols[r.next as usize].prev = b.left as isize;
            }
            if l.prev >= 0 {
                self.try_add(text, &symbols, l.prev as usize, b.left, &mut queue);
            }
            if r.next >= 0 {
                self.try_add(text, &symbols, b.left, r.next as usize, &mut queue);
            }
        }
        let mut ids = Vec::with_capacity(symbols.len());
        let mut offsets = Vec::with_capacity(symbols.len());
        let mut i: isize = if symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = symbols[i as usize];
            let piece = &text[s.start..s.start + s.len];
            if let Some(id) = self.table.get(piece) {
                ids.push(id);
                offsets.push(s.ch);
            } else {
                for &byte in piece.as_bytes() {
                    let id = self.byte_tokens[byte as usize].ok_or_else(|| {
                        format!("no token for byte 0x{byte:02X} and no unknown token")
                    })?;
                    ids.push(id);
                    offsets.push(s.ch);
                }
            }
            i = s.next;
        }
        Ok((ids, offsets))
    }

    fn try_add(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (&symbols[left], &symbols[right]);
        let size = l.len + r.len;
        if let Some(id) = self.table.get(&text[l.start..l.start + size]) {
            queue.push(Bigram {
                score: self.scores[id as usize],
                left,
                right,
                size,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(texts: &[&str]) -> Arc<TokenTable> {
        let lens: Vec<usize> = texts.iter().map(|t| t.chars().count()).collect();
        Arc::new(TokenTable::new(texts.concat(), &lens).unwrap())
    }

    fn vocab(tokens: &[(&str, f32)]) -> SpmVocab {
        let texts: Vec<&str> = tokens.iter().map(|t| t.0).collect();
        let scores: Vec<f32> = tokens.iter().map(|t| t.1).collect();
        SpmVocab::new(table(&texts), &scores, [Some(0); 256]).unwrap()
    }

    /// "?", "a", "b", "c" and the two pairs "ab", "bc" with the given scores (ids 4 and 5).
    fn abc_vocab(ab: f32, bc: f32) -> SpmVocab {
        vocab(&[
            ("?", 0.0),
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", ab),
            ("bc", bc),
        ])
    }

    #[test]
    fn merges_by_score_then_leftmost() {
        // "ab" outscores "bc": "abc" -> ab + c; equal scores -> the left pair wins
        assert_eq!(
            abc_vocab(2.0, 1.0).encode("abc").unwrap(),
            (vec![4, 3], vec![0, 2])
        );
        assert_eq!(abc_vocab(1.0, 1.0).encode("abc").unwrap().0, vec![4, 3]);
        assert_eq!(abc_vocab(1.0, 2.0).encode("abc").unwrap().0, vec![1, 5]);
    }

    #[test]
    fn merges_through_characters_outside_the_vocabulary() {
        // "é" is no token, but "xé" is: llama.cpp merges them; a lone "é" falls back to bytes
        let v = vocab(&[("?", 0.0), ("x", 0.0), ("xé", 1.0)]);
        assert_eq!(v.encode("xé").unwrap(), (vec![2], vec![0]));
        assert_eq!(v.encode("éx").unwrap(), (vec![0, 0, 1], vec![0, 0, 1]));
        assert_eq!(v.encode("").unwrap(), (vec![], vec![]));
    }

    #[test]
    fn missing_byte_token_is_an_error() {
        let v = SpmVocab::new(table(&["a"]), &[0.0], [None; 256]).unwrap();
        assert_eq!(v.encode("a").unwrap().0, vec![0]);
        assert!(v.encode("!").is_err());
    }
}
