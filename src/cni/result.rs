//! Typed CNI results (spec 0.3.x/0.4.0 and 1.x), keeping the raw JSON for `prevResult`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde_json::Value;

use super::util::{parse_version, truncate};

/// Why a plugin's output is not a usable CNI result.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResultError {
    /// The plugin printed nothing.
    #[error("empty output (no result)")]
    Empty,
    /// The output is not JSON.
    #[error("output is not JSON ({error}): {output:?}")]
    NotJson {
        /// The parser's complaint.
        error: String,
        /// The (truncated) output.
        output: String,
    },
    /// JSON, but not a result object of a supported version.
    #[error("invalid result: {0}")]
    Invalid(String),
}

/// An IP address with a prefix length, as in CNI's `"10.1.2.3/24"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    /// The address (host bits kept, as CNI does).
    pub addr: IpAddr,
    /// Prefix length (0..=32 or 0..=128).
    pub prefix_len: u8,
}

impl FromStr for IpNet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not in CIDR notation"))?;
        let addr: IpAddr = a.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let prefix_len: u8 = p
            .parse()
            .map_err(|_| format!("{s:?}: invalid prefix length"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(format!("{s:?}: prefix length {prefix_len} > {max}"));
        }
        Ok(IpNet { addr, prefix_len })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// One entry of `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC address, if reported.
    pub mac: Option<String>,
    /// Netns path for interfaces inside the sandbox; `None` for host-side interfaces.
    pub sandbox: Option<String>,
    /// MTU (spec 1.1), if reported.
    pub mtu: Option<u32>,
}

/// One entry of `ips`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with prefix.
    pub address: IpNet,
    /// Default gateway for this address, if any.
    pub gateway: Option<IpAddr>,
    /// Index into [`CniResult::interfaces`], if given.
    pub interface: Option<usize>,
}

/// One entry of `routes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network.
    pub dst: IpNet,
    /// Next hop; `None` means the default gateway / on-link.
    pub gw: Option<IpAddr>,
}

/// The `dns` object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dns {
    /// Name servers.
    pub nameservers: Vec<String>,
    /// Local domain.
    pub domain: Option<String>,
    /// Search domains.
    pub search: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

/// A parsed CNI result plus its raw JSON (passed verbatim as the next plugin's `prevResult`
/// and written to the cache, so fields this struct does not model are never lost).
#[derive(Debug, Clone, PartialEq)]
pub struct CniResult {
    /// The result's `cniVersion`.
    pub cni_version: String,
    /// `interfaces`.
    pub interfaces: Vec<Interface>,
    /// `ips` (IPv4 and IPv6).
    pub ips: Vec<IpConfig>,
    /// `routes`.
    pub routes: Vec<Route>,
    /// `dns`.
    pub dns: Dns,
    raw: Value,
}

impl CniResult {
    /// Parses a plugin's stdout. A result without `cniVersion` gets `default_version` (the
    /// config's), as libcni does.
    pub fn parse(output: &[u8], default_version: &str) -> Result<Self, ResultError> {
        if output.iter().all(u8::is_ascii_whitespace) {
            return Err(ResultError::Empty);
        }
        let value: Value = serde_json::from_slice(output).map_err(|e| ResultError::NotJson {
            error: e.to_string(),
            output: truncate(&String::from_utf8_lossy(output), 512),
        })?;
        Self::from_value(value, default_version)
    }

    /// Parses an already decoded JSON result (see [`CniResult::parse`]).
    pub fn from_value(mut raw: Value, default_version: &str) -> Result<Self, ResultError> {
        let obj = raw
            .as_object_mut()
            .ok_or_else(|| ResultError::Invalid("result is not a JSON object".into()))?;
        let cni_version = match obj.get("cniVersion") {
            None | Some(Value::Null) => {
                obj.insert("cniVersion".into(), Value::from(default_version));
                default_version.to_string()
            }
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(ResultError::Invalid(format!(
                    "cniVersion is not a string: {other}"
                )));
            }
        };
        let v = parse_version(&cni_version)
            .ok_or_else(|| ResultError::Invalid(format!("invalid cniVersion {cni_version:?}")))?;
        if v < (0, 3, 0) {
            return Err(ResultError::Invalid(format!(
                "result version {cni_version} (pre-0.3.0 ip4/ip6 format) is not supported"
            )));
        }
        if obj.contains_key("code") && obj.contains_key("msg") && !obj.contains_key("ips") {
            return Err(ResultError::Invalid(
                "output is a CNI error object, not a result".into(),
            ));
        }

        let interfaces = array(obj.get("interfaces"), "interfaces")?
            .iter()
            .map(parse_interface)
            .collect::<Result<Vec<_>, _>>()?;
        let ips = array(obj.get("ips"), "ips")?
            .iter()
            .map(|ip| parse_ip(ip, interfaces.len()))
            .collect::<Result<Vec<_>, _>>()?;
        let routes = array(obj.get("routes"), "routes")?
            .iter()
            .map(parse_route)
            .collect::<Result<Vec<_>, _>>()?;
        let dns = match obj.get("dns") {
            None | Some(Value::Null) => Dns::default(),
            Some(d) => parse_dns(d)?,
        };
        Ok(CniResult {
            cni_version,
            interfaces,
            ips,
            routes,
            dns,
            raw,
        })
    }

    /// The raw JSON of the result (with `cniVersion` filled in).
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// All IP configurations, IPv4 and IPv6, in result order.
    pub fn ips(&self) -> &[IpConfig] {
        &self.ips
    }

    /// The IP configurations of the interface named `ifname` inside the sandbox (an interface
    /// with a non-empty `sandbox`), e.g. the pod's `eth0`. If *no* IP in the result names an
    /// interface (some IPAM-only chains omit `interface`), all IPs are returned.
    pub fn sandbox_ips(&self, ifname: &str) -> Vec<&IpConfig> {
        if self.ips.iter().all(|ip| ip.interface.is_none()) {
            return self.ips.iter().collect();
        }
        self.ips
            .iter()
            .filter(|ip| {
                ip.interface
                    .and_then(|i| self.interfaces.get(i))
                    .is_some_and(|intf| {
                        intf.name == ifname
                            && intf.sandbox.as_deref().is_some_and(|s| !s.is_empty())
                    })
            })
            .collect()
    }

    /// Plain addresses of [`CniResult::sandbox_ips`], IPv4 first then IPv6 (stable within each
    /// family), the order CRI reports pod IPs in.
    pub fn sandbox_addrs(&self, ifname: &str) -> Vec<IpAddr> {
        let ips = self.sandbox_ips(ifname);
        let v4 = ips.iter().filter(|i| i.address.addr.is_ipv4());
        let v6 = ips.iter().filter(|i| i.address.addr.is_ipv6());
        v4.chain(v6).map(|i| i.address.addr).collect()
    }
}

fn array<'a>(v: Option<&'a Value>, what: &str) -> Result<&'a [Value], ResultError> {
    match v {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(ResultError::Invalid(format!("{what} is not an array"))),
    }
}

fn opt_str<'a>(
    o: &'a serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, ResultError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ResultError::Invalid(format!("{key} is not a string"))),
    }
}

fn str_list(o: &serde_json::Map<String, Value>, key: &str) -> Result<Vec<String>, ResultError> {
    array(o.get(key), key)?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| ResultError::Invalid(format!("{key} contains a non-string")))
        })
        .collect()
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a serde_json::Map<String, Value>, ResultError> {
    v.as_object()
        .ok_or_else(|| ResultError::Invalid(format!("{what} entry is not an object")))
}

fn parse_interface(v: &Value) -> Result<Interface, ResultError> {
    let o = object(v, "interfaces")?;
    let name = opt_str(o, "name")?
        .ok_or_else(|| ResultError::Invalid("interface without name".into()))?
        .to_string();
    let mtu = match o.get("mtu") {
        None | Some(Value::Null) => None,
        Some(m) => Some(
            m.as_u64()
                .and_then(|m| u32::try_from(m).ok())
                .ok_or_else(|| ResultError::Invalid(format!("interface {name}: invalid mtu")))?,
        ),
    };
    Ok(Interface {
        mac: opt_str(o, "mac")?
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        sandbox: opt_str(o, "sandbox")?
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        mtu,
        name,
    })
}

fn parse_ip(v: &Value, n_interfaces: usize) -> Result<IpConfig, ResultError> {
    let o = object(v, "ips")?;
    let address: IpNet = opt_str(o, "address")?
        .ok_or_else(|| ResultError::Invalid("ips entry without address".into()))?
        .parse()
        .map_err(ResultError::Invalid)?;
    let gateway = opt_str(o, "gateway")?
        .filter(|s| !s.is_empty())
        .map(|g| {
            g.parse::<IpAddr>()
                .map_err(|e| ResultError::Invalid(format!("gateway {g:?}: {e}")))
        })
        .transpose()?;
    // 0.3.x/0.4.0 carry "version": "4" | "6"; 1.x dropped it. If present it must agree.
    if let Some(ver) = opt_str(o, "version")? {
        let ok = match ver {
            "4" => address.addr.is_ipv4(),
            "6" => address.addr.is_ipv6(),
            _ => false,
        };
        if !ok {
            return Err(ResultError::Invalid(format!(
                "ips entry {address}: version {ver:?} does not match the address"
            )));
        }
    }
    let interface = match o.get("interface") {
        None | Some(Value::Null) => None,
        Some(i) => {
            let i = i
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(|| {
                    ResultError::Invalid(format!("ips entry {address}: invalid interface index"))
                })?;
            if i >= n_interfaces {
                return Err(ResultError::Invalid(format!(
                    "ips entry {address}: interface index {i} out of range ({n_interfaces} interfaces)"
                )));
            }
            Some(i)
        }
    };
    Ok(IpConfig {
        address,
        gateway,
        interface,
    })
}

fn parse_route(v: &Value) -> Result<Route, ResultError> {
    let o = object(v, "routes")?;
    let dst = opt_str(o, "dst")?
        .ok_or_else(|| ResultError::Invalid("route without dst".into()))?
        .parse()
        .map_err(ResultError::Invalid)?;
    let gw = opt_str(o, "gw")?
        .filter(|s| !s.is_empty())
        .map(|g| {
            g.parse::<IpAddr>()
                .map_err(|e| ResultError::Invalid(format!("route gw {g:?}: {e}")))
        })
        .transpose()?;
    Ok(Route { dst, gw })
}

fn parse_dns(v: &Value) -> Result<Dns, ResultError> {
    let o = v
        .as_object()
        .ok_or_else(|| ResultError::Invalid("dns is not an object".into()))?;
    Ok(Dns {
        nameservers: str_list(o, "nameservers")?,
        domain: opt_str(o, "domain")?.map(str::to_string),
        search: str_list(o, "search")?,
        options: str_list(o, "options")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = r#"{
      "cniVersion": "1.0.0",
      "interfaces": [
        {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
        {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02"},
        {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/var/run/netns/pod1"}
      ],
      "ips": [
        {"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 2},
        {"address": "fd00:88::5/64", "gateway": "fd00:88::1", "interface": 2},
        {"address": "10.88.0.1/16", "interface": 0}
      ],
      "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00:88::1"}],
      "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local",
              "search": ["default.svc.cluster.local"], "options": ["ndots:5"]},
      "futureKey": {"kept": true}
    }"#;

    #[test]
    fn parses_v1_dual_stack() {
        let r = CniResult::parse(V1.as_bytes(), "1.0.0").unwrap();
        assert_eq!(r.cni_version, "1.0.0");
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(
            r.interfaces[2].sandbox.as_deref(),
            Some("/var/run/netns/pod1")
        );
        assert_eq!(r.interfaces[0].sandbox, None);
        assert_eq!(r.ips().len(), 3);
        assert_eq!(r.ips()[0].address.to_string(), "10.88.0.5/16");
        assert_eq!(r.ips()[0].gateway, Some("10.88.0.1".parse().unwrap()));
        assert_eq!(
            r.ips()[1].address.addr,
            "fd00:88::5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(r.ips()[1].address.prefix_len, 64);
        assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(r.routes[0].gw, None);
        assert_eq!(r.routes[1].gw, Some("fd00:88::1".parse().unwrap()));
        assert_eq!(r.dns.nameservers, vec!["10.96.0.10"]);
        assert_eq!(r.dns.domain.as_deref(), Some("cluster.local"));
        assert_eq!(r.dns.options, vec!["ndots:5"]);
        // unknown keys survive in the raw JSON
        assert_eq!(r.raw()["futureKey"]["kept"], Value::Bool(true));
    }

    #[test]
    fn sandbox_ips_pick_the_pod_interface_only() {
        let r = CniResult::parse(V1.as_bytes(), "1.0.0").unwrap();
        let ips: Vec<String> = r
            .sandbox_ips("eth0")
            .iter()
            .map(|i| i.address.to_string())
            .collect();
        assert_eq!(ips, vec!["10.88.0.5/16", "fd00:88::5/64"]);
        // cni0 has no sandbox → not a pod interface
        assert!(r.sandbox_ips("cni0").is_empty());
        assert!(r.sandbox_ips("eth1").is_empty());
        assert_eq!(
            r.sandbox_addrs("eth0"),
            vec![
                "10.88.0.5".parse::<IpAddr>().unwrap(),
                "fd00:88::5".parse().unwrap()
            ]
        );
    }

    #[test]
    fn parses_040_with_version_field() {
        let out = r#"{"cniVersion":"0.4.0",
          "interfaces":[{"name":"eth0","sandbox":"/proc/1/ns/net"}],
          "ips":[{"version":"4","address":"192.168.1.7/24","gateway":"192.168.1.1","interface":0},
                 {"version":"6","address":"2001:db8::7/64","interface":0}],
          "dns":{}}"#;
        let r = CniResult::parse(out.as_bytes(), "0.4.0").unwrap();
        assert_eq!(r.cni_version, "0.4.0");
        assert_eq!(
            r.sandbox_addrs("eth0"),
            vec![
                "192.168.1.7".parse::<IpAddr>().unwrap(),
                "2001:db8::7".parse().unwrap()
            ]
        );
        assert_eq!(r.ips[1].gateway, None);
    }

    #[test]
    fn rejects_mismatched_version_field() {
        let out = r#"{"cniVersion":"0.4.0","ips":[{"version":"6","address":"192.168.1.7/24"}]}"#;
        let e = CniResult::parse(out.as_bytes(), "0.4.0").unwrap_err();
        assert!(
            matches!(e, ResultError::Invalid(ref m) if m.contains("does not match")),
            "{e}"
        );
    }

    #[test]
    fn missing_version_defaults_to_config_version() {
        let r = CniResult::parse(br#"{"ips":[{"address":"10.0.0.2/8"}]}"#, "1.1.0").unwrap();
        assert_eq!(r.cni_version, "1.1.0");
        assert_eq!(r.raw()["cniVersion"], "1.1.0");
        // no interface indices at all → every IP counts as the sandbox's
        assert_eq!(
            r.sandbox_addrs("eth0"),
            vec!["10.0.0.2".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn rejects_bad_output() {
        assert_eq!(
            CniResult::parse(b"", "1.0.0").unwrap_err(),
            ResultError::Empty
        );
        assert_eq!(
            CniResult::parse(b" \n", "1.0.0").unwrap_err(),
            ResultError::Empty
        );
        assert!(matches!(
            CniResult::parse(b"hello", "1.0.0").unwrap_err(),
            ResultError::NotJson { ref output, .. } if output == "hello"
        ));
        for bad in [
            r#"[1,2]"#,
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/8"}}"#,
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.300/8"}]}"#,
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.3"}]}"#,
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.3/33"}]}"#,
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.3/8","interface":1}]}"#,
            r#"{"cniVersion":"1.0.0","routes":[{"gw":"10.0.0.1"}]}"#,
            r#"{"cniVersion":"1.0.0","code":7,"msg":"boom"}"#,
        ] {
            assert!(
                matches!(
                    CniResult::parse(bad.as_bytes(), "1.0.0"),
                    Err(ResultError::Invalid(_))
                ),
                "{bad} should be invalid"
            );
        }
    }
}
