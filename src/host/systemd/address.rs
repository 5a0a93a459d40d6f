//! D-Bus server addresses (`DBUS_SYSTEM_BUS_ADDRESS`), parsed as libdbus parses them
//! (`dbus_parse_address`), for the one transport the shim connects through: `unix:path=`.
//!
//! An address is a `;`-separated list of entries, each `transport:key=value,key=value`; a
//! value may hold `%XX` escapes and otherwise only the bytes libdbus leaves unescaped
//! (`[-0-9A-Za-z_/\.*]`). libdbus tries the entries in order until one connects, and so do we
//! ([`super::manager::Manager::connect`]), over the entries we can use: `unix:path=<socket>`
//! (a `guid=` key is allowed and not checked). Everything else is refused with the reason:
//! `unix:abstract=` (the shim never uses abstract sockets: any process of the network
//! namespace can bind the name first), the listen-only `unix:tmpdir=`/`dir=`/`runtime=`, and
//! the other transports (`tcp:`, `nonce-tcp:`, `unixexec:`, `launchd:`, `autolaunch:`,
//! `systemd:`). go-systemd (runc's client) honours the variable too, through godbus.

use std::path::PathBuf;

/// The environment variable naming the system bus (libdbus, godbus, sd-bus).
pub const SYSTEM_BUS_ENV: &str = "DBUS_SYSTEM_BUS_ADDRESS";

/// The sockets of `address`'s `unix:path=` entries, in order; an error says why there is
/// none we can use (each refused entry and why) or why the address is malformed.
pub fn unix_paths(address: &str) -> Result<Vec<PathBuf>, String> {
    let mut paths = Vec::new();
    let mut refused = Vec::new();
    for entry in address.split(';') {
        // libdbus skips empty entries (a trailing `;`).
        if entry.is_empty() {
            continue;
        }
        match unix_path(entry)? {
            Ok(p) => paths.push(p),
            Err(why) => refused.push(format!("{entry:?}: {why}")),
        }
    }
    if !paths.is_empty() {
        return Ok(paths);
    }
    if refused.is_empty() {
        return Err("the address is empty".into());
    }
    Err(format!(
        "no entry the shim can connect through (only unix:path= is supported): {}",
        refused.join("; ")
    ))
}

/// One entry: `Ok(Ok(path))` for `unix:path=`, `Ok(Err(why))` for a well-formed entry we do
/// not use, `Err` for a malformed one (libdbus refuses the whole address then).
fn unix_path(entry: &str) -> Result<Result<PathBuf, String>, String> {
    let Some((transport, rest)) = entry.split_once(':') else {
        return Err(format!("{entry:?}: no colon after the transport name"));
    };
    if transport.is_empty() {
        return Err(format!("{entry:?}: no transport name"));
    }
    let mut keys: Vec<(String, Vec<u8>)> = Vec::new();
    for pair in rest.split(',').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("{entry:?}: {pair:?} has no '='"));
        };
        if k.is_empty() {
            return Err(format!("{entry:?}: a key is empty"));
        }
        let key = unescape(k).map_err(|e| format!("{entry:?}: {e}"))?;
        let value = unescape(v).map_err(|e| format!("{entry:?}: {e}"))?;
        let key = String::from_utf8(key).map_err(|_| format!("{entry:?}: a key is not text"))?;
        if keys.iter().any(|(seen, _)| *seen == key) {
            return Err(format!("{entry:?}: key {key:?} given twice"));
        }
        keys.push((key, value));
    }
    if transport != "unix" {
        return Ok(Err(format!("transport {transport:?} is not supported")));
    }
    let mut path = None;
    for (k, v) in keys {
        match k.as_str() {
            "path" => path = Some(v),
            "guid" => {}
            "abstract" => {
                return Ok(Err(
                    "abstract sockets are not used (any process of the network namespace can \
                     take the name)"
                        .into(),
                ));
            }
            "tmpdir" | "dir" | "runtime" => {
                return Ok(Err(format!("{k}= is for servers to listen on")));
            }
            other => return Ok(Err(format!("unknown key {other:?}"))),
        }
    }
    let Some(path) = path else {
        return Ok(Err("no path=".into()));
    };
    use std::os::unix::ffi::OsStringExt;
    let path = PathBuf::from(std::ffi::OsString::from_vec(path));
    if !path.is_absolute() || path.as_os_str().len() >= 108 || path.as_os_str().is_empty() {
        return Ok(Err(format!(
            "path {} is not an absolute socket path that fits sockaddr_un",
            path.display()
        )));
    }
    Ok(Ok(path))
}

/// A value's bytes: `%XX` decoded; any other byte must be one libdbus leaves unescaped.
fn unescape(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| "'%' is not followed by two hex digits".to_string())?;
                out.push(hex);
                i += 3;
            }
            c if c.is_ascii_alphanumeric() || b"-_/\\*.".contains(&c) => {
                out.push(c);
                i += 1;
            }
            c => {
                return Err(format!(
                    "character {:?} should have been escaped",
                    char::from(c)
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_paths_are_taken_in_order_with_escapes_decoded() {
        assert_eq!(
            unix_paths("unix:path=/run/dbus/system_bus_socket").unwrap(),
            vec![PathBuf::from("/run/dbus/system_bus_socket")]
        );
        assert_eq!(
            unix_paths("unix:path=/a%20b,guid=0123;unix:path=/c;").unwrap(),
            vec![PathBuf::from("/a b"), PathBuf::from("/c")]
        );
        // An entry we cannot use is passed over when another one can be used (libdbus tries
        // each in turn).
        assert_eq!(
            unix_paths("tcp:host=localhost,port=1;unix:path=/s").unwrap(),
            vec![PathBuf::from("/s")]
        );
    }

    #[test]
    fn what_the_shim_cannot_use_is_refused_with_the_reason() {
        for (address, why) in [
            ("unix:abstract=/tmp/dbus-x", "abstract sockets are not used"),
            (
                "tcp:host=localhost,port=4",
                "transport \"tcp\" is not supported",
            ),
            (
                "unixexec:path=/bin/x",
                "transport \"unixexec\" is not supported",
            ),
            ("unix:tmpdir=/tmp", "tmpdir= is for servers"),
            ("unix:runtime=yes", "runtime= is for servers"),
            ("unix:guid=00", "no path="),
            ("unix:path=relative", "not an absolute socket path"),
            ("", "the address is empty"),
            // malformed: libdbus refuses the whole address
            ("unix", "no colon"),
            ("unix:path", "has no '='"),
            ("unix:path=/a b", "' ' should have been escaped"),
            ("unix:path=/a%2", "two hex digits"),
            ("unix:path=/a%zz", "two hex digits"),
            ("unix:path=/a,path=/b", "given twice"),
            ("unix:path=/ok;tcp", "no colon"),
        ] {
            let e = unix_paths(address).unwrap_err();
            assert!(e.contains(why), "{address:?}: {e}");
        }
    }
}
