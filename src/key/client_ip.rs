//! The client address: the TCP peer, or what trusted proxies say of the client in `Forwarded` / `X-Forwarded-For`.

use std::fmt;
use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

/// Finds the client address: the peer, or, when the peer is a trusted proxy, the nearest untrusted address of
/// `Forwarded` / `X-Forwarded-For`, walking from the right past trusted hops.
#[derive(Debug, Clone)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    /// How many bits of an IPv6 client address key it.
    ipv6_prefix: u8,
}

// === impl ClientIpResolver ===

impl ClientIpResolver {
    /// A resolver that believes forwarding headers only from peers within `trusted`, keying IPv6 clients by /64.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        Self {
            trusted,
            ipv6_prefix: 64,
        }
    }

    /// Keys IPv6 clients by their network of `bits` bits (1 to 128; 128 keys each address).
    #[must_use]
    pub fn with_ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.clamp(1, 128);
        self
    }

    /// How many bits of an IPv6 client address key it (see [`RequestFacts::ipv6_prefix`]).
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The client address of a request from `peer`.
    ///
    /// Headers are believed only when the peer is trusted. `Forwarded` is preferred to `X-Forwarded-For` when both
    /// are present. Walking from the nearest hop outwards, trusted hops are skipped and the first untrusted address
    /// is the client; a malformed entry stops the walk at the last address known good (a trusted proxy wrote what
    /// follows it, but nobody vouches for the malformed value).
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return peer;
        }
        let forwarded: Vec<&str> = headers
            .get_all(http::header::FORWARDED)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let hops: Vec<Option<IpAddr>> = if !forwarded.is_empty() {
            forwarded
                .iter()
                .flat_map(|v| v.split(','))
                .map(forwarded_for)
                .collect()
        } else {
            headers
                .get_all("x-forwarded-for")
                .iter()
                .flat_map(|v| match v.to_str() {
                    Ok(s) => s
                        .split(',')
                        .map(|hop| parse_ip(hop.trim()))
                        .collect::<Vec<_>>(),
                    Err(_) => vec![None],
                })
                .collect()
        };
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            match hop {
                Some(ip) => {
                    client = ip;
                    if !self.is_trusted(ip) {
                        return ip;
                    }
                }
                None => return client,
            }
        }
        client
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }
}

/// The address as text, as `Display` writes it; IPv4 without the formatting machinery, which showed in profiles
/// (an address is written for every `ip` key part and every `X-Forwarded-For`).
pub fn ip_text(ip: IpAddr) -> String {
    let mut text = String::with_capacity(15);
    push_ip_text(&mut text, ip);
    text
}

/// Appends [`ip_text`] of `ip` to `out`.
pub fn push_ip_text(out: &mut String, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        use fmt::Write;
        let _ = write!(out, "{ip}");
        return;
    };
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) are the IPv4 client they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses an address as proxies write it: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sock) = text.parse::<std::net::SocketAddr>() {
        return Some(canonical(sock.ip()));
    }
    let inner = text.strip_prefix('[')?.split(']').next()?;
    inner.parse::<IpAddr>().ok().map(canonical)
}

/// The `for=` address of one `Forwarded` element (RFC 7239); `None` when absent, obfuscated or malformed.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
        .and_then(|(_, value)| parse_ip(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn ip_text_writes_addresses_as_display_does() {
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "255.255.255.255",
            "192.0.2.45",
            "::1",
            "2001:db8::ff00:42:8329",
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for n in (0..=u32::MAX).step_by(16_777_259) {
            let ip = IpAddr::from(n.to_be_bytes());
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn resolver() -> ClientIpResolver {
        ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()])
    }

    fn xff(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        assert_eq!(
            resolver().resolve(ip("192.0.2.1"), &xff("203.0.113.9")),
            ip("192.0.2.1")
        );
    }

    #[test]
    fn walks_right_to_left_past_trusted_hops() {
        let headers = xff("198.51.100.7, 203.0.113.9, 10.1.1.1");
        assert_eq!(
            resolver().resolve(ip("10.0.0.1"), &headers),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn malformed_hop_stops_at_last_good_address() {
        let headers = xff("203.0.113.9, not-an-ip, 10.1.1.1");
        assert_eq!(resolver().resolve(ip("10.0.0.1"), &headers), ip("10.1.1.1"));
    }

    #[test]
    fn forwarded_header_is_preferred() {
        let mut headers = xff("198.51.100.7");
        headers.insert(
            http::header::FORWARDED,
            HeaderValue::from_static("for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\""),
        );
        assert_eq!(
            resolver().resolve(ip("10.0.0.1"), &headers),
            ip("2001:db8::1")
        );
    }
}
