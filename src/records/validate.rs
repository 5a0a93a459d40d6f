//! Validation of identifiers that become file names, socket names and runc IDs.

use crate::records::error::{Error, Result};

/// Longest ID we accept. containerd's own limit is 76; CRI IDs are 64 hex characters.
pub const MAX_ID_LEN: usize = 128;

/// Checks that `id` is safe to use as a path component and as a runc container ID:
/// non-empty, at most [`MAX_ID_LEN`] bytes, only `[A-Za-z0-9._-]`, starting with an
/// alphanumeric character (so never `.`, `..`, or an option-looking `-x`).
pub fn id(what: &str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid(format!("{what} must not be empty")));
    }
    if id.len() > MAX_ID_LEN {
        // The first characters name it; never slice by bytes (a character may straddle).
        let head: String = id.chars().take(16).collect();
        return Err(Error::invalid(format!(
            "{what} {head:?}... is {} bytes long, the limit is {MAX_ID_LEN}",
            id.len()
        )));
    }
    let first_ok = id.as_bytes()[0].is_ascii_alphanumeric();
    let chars_ok = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if !first_ok || !chars_ok || id.contains("..") {
        return Err(Error::invalid(format!(
            "{what} {id:?} is not valid: use letters, digits, '.', '_' and '-', starting with a letter or digit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::error::Kind;

    #[test]
    fn accepts_containerd_and_cri_ids() {
        for ok in ["t1", "a.b_c-d", &"f".repeat(64), "0abc", "exec-1"] {
            id("task id", ok).unwrap();
        }
    }

    #[test]
    fn rejects_path_like_and_odd_ids() {
        for bad in [
            "",
            "a/b",
            "..",
            ".",
            "../x",
            "a..b",
            "-rf",
            ".hidden",
            "a b",
            "a\0b",
            "ä",
            &"x".repeat(129),
        ] {
            let e = id("task id", bad).unwrap_err();
            assert_eq!(e.kind(), Kind::InvalidArgument, "{bad:?}");
            assert!(e.message().starts_with("task id"), "{}", e.message());
        }
    }

    #[test]
    fn long_ids_of_multibyte_characters_never_panic() {
        // Every length up to 300 bytes, with the multi-byte character at every offset: the
        // message takes characters, never bytes.
        for len in 0..=300usize {
            for c in ['ä', '€', '😀'] {
                let mut id: String = "a".repeat(len.saturating_sub(c.len_utf8()));
                for at in [0, 1, 15, 16, 17] {
                    if at > id.len() {
                        continue;
                    }
                    let mut s = id.clone();
                    s.insert(at, c);
                    let e = super::id("task id", &s).unwrap_err();
                    assert_eq!(e.kind(), Kind::InvalidArgument);
                }
                id.push(c);
                assert!(super::id("task id", &id).is_err());
            }
        }
    }
}
