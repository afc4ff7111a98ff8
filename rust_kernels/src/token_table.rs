//! A vocabulary's text -> id lookup built in one pass over one string: all token texts live in a
//! single arena and an open-addressing table holds their ids, so building it for a 262k-token
//! vocabulary costs two allocations instead of one per token.

/// FxHash-style mixing plus a finaliser: token texts are short, and the table is fixed once built (no key an
/// attacker adds at run time), so SipHash's cost buys nothing here.
fn hash(bytes: &[u8]) -> u64 {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let word = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(SEED);
    }
    // murmur3's finaliser: the table indexes by the low bits, which the multiplications above
    // leave poorly mixed (long probe runs without this)
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

const EMPTY: u32 = u32::MAX;

pub struct TokenTable {
    arena: String,
    spans: Vec<(u32, u32)>, // byte start and length of each token's text in `arena`
    slots: Vec<u32>,        // token ids; EMPTY where free
    distinct: usize,
}

impl TokenTable {
    /// `arena` is every token's text concatenated; `char_lens[i]` is token i's length in
    /// characters. A repeated text keeps its first id.
    pub fn new(arena: String, char_lens: &[usize]) -> Result<Self, String> {
        if u32::try_from(char_lens.len()).map_or(true, |n| n == EMPTY)
            || u32::try_from(arena.len()).is_err()
        {
            return Err("vocabulary too large".into());
        }
        let mut bounds = arena
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(arena.len()));
        let mut start = bounds.next().unwrap_or(0);
        let mut spans = Vec::with_capacity(char_lens.len());
        for &n in char_lens {
            let end = if n == 0 {
                start
            } else {
                bounds
                    .nth(n - 1)
                    .ok_or("the joined text is shorter than the tokens")?
            };
            spans.push((start as u32, (end - start) as u32));
            start = end;
        }
        if start != arena.len() {
            return Err("the joined text is longer than the tokens".into());
        }
        let size = (char_lens.len() * 2).next_power_of_two().max(16);
        let mut table = Self {
            arena,
            spans,
            slots: vec![EMPTY; size],
            distinct: 0,
        };
        for id in 0..table.spans.len() as u32 {
            let text = table.text(id);
            let mut slot = hash(text.as_bytes()) as usize & (size - 1);
            loop {
                let held = table.slots[slot];
                if held == EMPTY {
                    table.slots[slot] = id;
                    table.distinct += 1;
                    break;
                }
                if table.text(held) == text {
                    break; // a repeat: the first id stays
                }
                slot = (slot + 1) & (size - 1);
            }
        }
        Ok(table)
    }

    pub fn text(&self, id: u32) -> &str {
        let (start, len) = self.spans[id as usize];
        &self.arena[start as usize..(start + len) as usize]
    }

    pub fn get(&self, text: &str) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut slot = hash(text.as_bytes()) as usize & mask;
        loop {
            let held = self.slots[slot];
            if held == EMPTY {
                return None;
            }
            if self.text(held) == text {
                return Some(held);
            }
            slot = (slot + 1) & mask;
        }
    }

    /// Tokens, repeats included.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Different texts: less than `len()` when the vocabulary repeats one.
    pub fn distinct(&self) -> usize {
        self.distinct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_repeats_and_empty_texts() {
        let tokens = ["a", "", "bé", "日本", "a", "bé!"];
        let lens: Vec<usize> = tokens.iter().map(|t| t.chars().count()).collect();
        let t = TokenTable::new(tokens.concat(), &lens).unwrap();
        assert_eq!((t.len(), t.distinct()), (6, 5));
        assert_eq!(t.get("a"), Some(0));
        assert_eq!(t.get(""), Some(1));
        assert_eq!(t.get("bé"), Some(2));
        assert_eq!(t.get("日本"), Some(3));
        assert_eq!(t.get("bé!"), Some(5));
        assert_eq!(t.get("b"), None);
        assert_eq!(t.text(3), "日本");
        assert!(TokenTable::new("abc".into(), &[1, 1]).is_err());
        assert!(TokenTable::new("a".into(), &[1, 1]).is_err());
    }
}
