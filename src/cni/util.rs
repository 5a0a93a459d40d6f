//! Small helpers shared by the CNI modules: spec version parsing and shortening plugin output
//! for messages. A leaf: it imports nothing from the other CNI modules, so all of them can use
//! it without an import cycle.

/// Parses `"x.y.z"` (a missing patch or minor counts as 0, like libcni's version parser).
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next().map_or(Some(0), |s| s.parse().ok())?;
    let patch = it.next().map_or(Some(0), |s| s.parse().ok())?;
    if it.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// Shortens `s` to at most `max` bytes (on a char boundary), marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parsing() {
        assert_eq!(parse_version("1.0.0"), Some((1, 0, 0)));
        assert_eq!(parse_version("0.4"), Some((0, 4, 0)));
        assert_eq!(parse_version("1.1.0"), Some((1, 1, 0)));
        assert_eq!(parse_version("1.x"), None);
        assert_eq!(parse_version(""), None);
        assert_eq!(parse_version("1.0.0.0"), None);
    }

    #[test]
    fn truncation_cuts_on_a_char_boundary() {
        assert_eq!(truncate("short", 5), "short");
        assert_eq!(truncate("abcdef", 3), "abc…");
        // 'é' is two bytes: a cut inside it moves back before it
        assert_eq!(truncate("aé", 2), "a…");
    }
}
