//! What containerd does with an imported file whose config `version` is higher than the root
//! config's, release by release (`cmd/containerd/server/config/config.go`, `LoadConfig`):
//!
//! - 2.1 and 2.2: a file of version 0 or 1 is migrated to the current version before it is
//!   merged (`case 0, 1: config.MigrateConfigTo(ctx, out.Version)`, v2.1.9 config.go:311-318);
//!   a file of version 2 is merged as written, and once a version-3 drop-in has raised the
//!   merged version, the root's version-2 plugin sections (`io.containerd.grpc.v1.cri`) are never
//!   migrated: the node's CRI settings are silently dropped.
//! - 2.3.0 to 2.3.4 and 2.4.0-beta.0: every file is migrated on load, but a drop-in of a
//!   higher version than the root's is refused and containerd does not start ("drop-in config
//!   version %d higher than root config version %d", v2.3.4 config.go:475-481, commit
//!   21248d007). A root without `version` (0) takes the first drop-in's version instead
//!   (`if rootConfigVersion == 0`), so it is never refused.
//! - after 2.3.4: the refusal was reverted (commit a8ed54668, containerd PR 13939, on main for
//!   2.4.0; cherry-picked to release/2.3 as 1125b053f, PR 13995), and every file is migrated
//!   on load: a higher drop-in should be loaded as written. No such release was tested here.

use super::version::Version;

/// The verdict on a drop-in of version `drop_in` above a root config of version `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// containerd loads both as meant.
    Loads(String),
    /// A release after the refusal's revert: loaded, not tested here.
    Untested(String),
    /// containerd refuses to start, or drops the root's settings.
    Breaks(String),
}

/// See the module doc. `containerd` is `None` when its version is unknown: the worst case of
/// the releases above is assumed.
pub fn verdict(containerd: Option<Version>, root: i64, drop_in: i64) -> Verdict {
    let refusing = |v: Version| {
        (v.at_least(Version::release(2, 3, 0)) && !v.at_least(Version::release(2, 3, 5)))
            || (v.major, v.minor, v.patch, v.pre) == (2, 4, 0, true)
    };
    let Some(v) = containerd else {
        return if root == 0 {
            Verdict::Loads(
                "a root config without `version` is migrated as a whole and takes any drop-in's \
                 version, in every release"
                    .into(),
            )
        } else {
            Verdict::Breaks(
                "containerd's version is unknown: 2.3.0 to 2.3.4 refuse to start; 2.1 and 2.2 drop \
                 the root config's older plugin sections"
                    .into(),
            )
        };
    };
    if !v.at_least(Version::release(2, 3, 0)) {
        if root <= 1 {
            Verdict::Loads(format!(
                "containerd {v} migrates a root config of version {root} before merging the \
                 version-{drop_in} drop-in"
            ))
        } else {
            Verdict::Breaks(format!(
                "containerd {v} merges the version-{drop_in} drop-in and then never migrates the \
                 root config's version-{root} plugin sections: its CRI settings are dropped"
            ))
        }
    } else if refusing(v) {
        if root == 0 {
            Verdict::Loads(format!(
                "containerd {v} takes a version-less root config's version from its first \
                 drop-in and migrates the root"
            ))
        } else {
            Verdict::Breaks(format!(
                "containerd {v} refuses to start: \"drop-in config version {drop_in} higher than \
                 root config version {root}\" (2.3.0 to 2.3.4, 2.4.0-beta.0)"
            ))
        }
    } else {
        Verdict::Untested(format!(
            "containerd {v} migrates every file on load, and the refusal of 2.3.0 to 2.3.4 is \
             reverted after 2.3.4; not tested here"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<Version> {
        Some(Version::parse(s).unwrap())
    }

    #[test]
    fn each_release_s_loader_is_told_apart() {
        use Verdict::*;
        let kind = |c: Option<Version>, root, d| match verdict(c, root, d) {
            Loads(_) => "loads",
            Untested(_) => "untested",
            Breaks(_) => "breaks",
        };
        for (containerd, root, drop_in, want) in [
            // the false block: a root without `version` beside a version-3 drop-in
            (v("2.1.9"), 0, 3, "loads"),
            (v("2.2.1"), 0, 3, "loads"),
            (v("2.3.4"), 0, 3, "loads"),
            (v("2.4.0-beta.0"), 0, 3, "loads"),
            (None, 0, 3, "loads"),
            (v("2.1.9"), 1, 3, "loads"),
            (v("2.1.9"), 2, 3, "breaks"),
            (v("2.2.7"), 2, 3, "breaks"),
            (v("2.3.0"), 2, 3, "breaks"),
            (v("2.3.0"), 1, 3, "breaks"),
            (v("2.3.4"), 2, 3, "breaks"),
            (v("2.4.0-beta.0"), 2, 3, "breaks"),
            (v("2.3.0-rc.1"), 2, 3, "breaks"),
            (v("2.3.5"), 2, 3, "untested"),
            (v("2.4.0"), 2, 3, "untested"),
            (None, 2, 3, "breaks"),
        ] {
            assert_eq!(
                kind(containerd, root, drop_in),
                want,
                "{containerd:?} root {root} drop-in {drop_in}"
            );
        }
        let Breaks(why) = verdict(v("2.3.4"), 2, 3) else {
            panic!()
        };
        assert!(why.contains("refuses to start"), "{why}");
    }
}
