//! Where an agent may connect (`egress_allow`): a list of `host:port` destinations. With a list,
//! an agent's container is on a network of its own with no route out, and its only way out is
//! the runner's HTTP proxy, which opens connections to the listed destinations and refuses the
//! rest. Destinations are matched as written: a name is not resolved to compare it with an
//! address, so `api.example.com:443` does not admit the address it resolves to.

use std::fmt;

/// The longest host name (DNS: 253 characters).
const HOST_MAX: usize = 253;

/// One destination an agent may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// A host name (lower case), IPv4 address, or IPv6 address without brackets; a leading
    /// `*.` admits every name below the rest (not the rest itself).
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The destinations of one profile; empty: no egress list (the network is `network_mode`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist(pub Vec<Destination>);

impl Allowlist {
    /// `host:port`, comma-separated (spaces around items ignored; empty: none). Hosts are DNS
    /// names (letters, digits, `-`, `.`; `*.` first for every name below), IPv4 addresses or
    /// `[IPv6]`; ports 1–65535.
    pub fn parse(list: &str) -> Result<Allowlist, String> {
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let d = parse_destination(item)?;
            if !out.contains(&d) {
                out.push(d);
            }
        }
        Ok(Allowlist(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// May an agent connect to `host` (as it asked for it) at `port`?
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        self.0.iter().any(|d| {
            d.port == port
                && match d.host.strip_prefix("*.") {
                    Some(parent) => host
                        .strip_suffix(parent)
                        .is_some_and(|below| below.len() > 1 && below.ends_with('.')),
                    None => d.host == host,
                }
        })
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

fn parse_destination(item: &str) -> Result<Destination, String> {
    let bad = |why: &str| format!("{item:?}: {why}");
    let (host, port) = if let Some(rest) = item.strip_prefix('[') {
        let (v6, port) = rest
            .split_once("]:")
            .ok_or_else(|| bad("an IPv6 destination is [address]:port"))?;
        v6.parse::<std::net::Ipv6Addr>()
            .map_err(|_| bad("not an IPv6 address"))?;
        (v6.to_ascii_lowercase(), port)
    } else {
        let (host, port) = item
            .rsplit_once(':')
            .ok_or_else(|| bad("a destination is host:port"))?;
        let host = host.to_ascii_lowercase();
        check_host(&host).map_err(bad)?;
        (host, port)
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad("the port is a number from 1 to 65535"))?;
    Ok(Destination { host, port })
}

fn check_host(host: &str) -> Result<(), &'static str> {
    let name = host.strip_prefix("*.").unwrap_or(host);
    if name.is_empty() || host.len() > HOST_MAX {
        return Err("the host is 1 to 253 characters");
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("the host is a DNS name (letters, digits, '-', '.'), `*.` and a name, or an address")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_match_as_written() {
        let l = Allowlist::parse(
            " API.example.com:443, llm:8080 ,10.0.0.7:80,[::1]:9000,*.corp.example:443",
        )
        .expect("parses");
        assert_eq!(
            l.to_string(),
            "api.example.com:443,llm:8080,10.0.0.7:80,[::1]:9000,*.corp.example:443"
        );
        assert!(l.allows("api.example.com", 443));
        assert!(l.allows("API.Example.COM.", 443));
        assert!(!l.allows("api.example.com", 80), "another port");
        assert!(!l.allows("example.com", 443), "a parent");
        assert!(!l.allows("evil-api.example.com", 443));
        assert!(l.allows("llm", 8080));
        assert!(!l.allows("llm2", 8080));
        assert!(l.allows("10.0.0.7", 80));
        assert!(l.allows("[::1]", 9000));
        assert!(l.allows("a.corp.example", 443));
        assert!(l.allows("b.a.corp.example", 443));
        assert!(
            !l.allows("corp.example", 443),
            "the wildcard is below the name only"
        );
        assert!(!l.allows("xcorp.example", 443));
        assert!(Allowlist::parse("").expect("empty").is_empty());
    }

    #[test]
    fn bad_destinations_are_refused_with_the_item() {
        for bad in [
            "example.com",
            "example.com:0",
            "example.com:65536",
            "example.com:https",
            ":443",
            "exa mple.com:443",
            "-x.com:443",
            "a..b:443",
            "[::1:443",
            "[nope]:443",
            "*.:443",
            "http://x:80",
        ] {
            let err = Allowlist::parse(bad).expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
    }
}
