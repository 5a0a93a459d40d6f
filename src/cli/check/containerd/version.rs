//! containerd's version as `containerd --version` prints it, and the releases that fixed what
//! rsandbox trips over.

/// Where the fixes landed.
pub const HOST_NETWORK_FIXED: Version = Version::release(2, 3, 0);
pub const OPTIONS_FIXED: Version = Version::release(2, 3, 1);

/// A containerd version: `2.1.9`, `v2.2.1`, `2.4.0-beta.0`, `2.1.9~ds1`, `2.1.9+unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// A pre-release (`-beta.0`, `-rc.1`): it counts as before the release.
    pub pre: bool,
}

impl Version {
    pub const fn release(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
            pre: false,
        }
    }

    /// Parses one version word.
    pub fn parse(word: &str) -> Option<Version> {
        let w = word.strip_prefix('v').unwrap_or(word);
        let end = w
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(w.len());
        let (digits, rest) = w.split_at(end);
        let mut it = digits.split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch = it.next().map_or(Some(0), |p| p.parse().ok())?;
        Some(Version {
            major,
            minor,
            patch,
            pre: rest.starts_with('-'),
        })
    }

    /// The version in `containerd --version`'s line (`containerd <package> <version>
    /// [<revision>]`): the first word after the name that parses.
    pub fn from_output(out: &str) -> Option<Version> {
        let line = out.lines().find(|l| !l.trim().is_empty())?;
        line.split_whitespace().skip(1).find_map(Version::parse)
    }

    /// Whether this is at least `other` (a pre-release of `other` is not).
    pub fn at_least(&self, other: Version) -> bool {
        let a = (self.major, self.minor, self.patch);
        let b = (other.major, other.minor, other.patch);
        a > b || (a == b && !self.pre)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if self.pre {
            write!(f, " (pre-release)")?;
        }
        Ok(())
    }
}
