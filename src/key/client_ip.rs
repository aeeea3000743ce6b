//! The client address: the TCP peer, or what trusted proxies say of the client in the one field they write
//! (`X-Forwarded-For`, `Forwarded` or `X-Real-IP`, as `client_ip.header` names it).

use std::fmt;
use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

/// Finds the client address: the peer, or, when the peer is a trusted proxy, the nearest untrusted address of
/// the field it writes, walking from the right past trusted hops.
#[derive(Debug, Clone)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    /// How many bits of an IPv6 client address key it.
    ipv6_prefix: u8,
    /// The one field believed from trusted proxies.
    header: ClientIpHeader,
}

/// `client_ip.header`: the field trusted proxies write the client address in. Only it is believed; the other two
/// are never believed, from anyone, and never forwarded (a proxy that writes one field passes the others through
/// from the client untouched).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For`, a list of addresses (the default).
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239), a list of elements whose `for=` is the address.
    Forwarded,
    /// `X-Real-IP`, one address.
    XRealIp,
}

// === impl ClientIpResolver ===

impl ClientIpResolver {
    /// A resolver that believes forwarding headers only from peers within `trusted`, keying IPv6 clients by /64.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        Self {
            trusted,
            ipv6_prefix: 64,
            header: ClientIpHeader::default(),
        }
    }

    /// Believes `header` from trusted proxies (and nothing else).
    #[must_use]
    pub fn with_header(mut self, header: ClientIpHeader) -> Self {
        self.header = header;
        self
    }

    /// The field believed from trusted proxies.
    pub fn header(&self) -> ClientIpHeader {
        self.header
    }

    /// Keys IPv6 clients by their network of `bits` bits (1 to 128; 128 keys each address).
    #[must_use]
    pub fn with_ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.clamp(1, 128);
        self
    }

    /// How many bits of an IPv6 client address key it (see [`RequestFacts::ipv6_prefix`](super::RequestFacts::ipv6_prefix)).
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The client address of a request from `peer`.
    ///
    /// The field is believed only when the peer is trusted, and only the one `client_ip.header` names. Walking
    /// from the nearest hop outwards, trusted hops are skipped and the first untrusted address is the client; a
    /// malformed entry stops the walk at the last address known good (a trusted proxy wrote what follows it, but
    /// nobody vouches for the malformed value).
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return peer;
        }
        let hops = believed_hops(self.header, headers);
        let mut client = peer;
        for hop in hops.iter().rev() {
            match parse_ip(hop) {
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
    write_ip(out, ip);
}

/// Appends [`ip_text`] of `ip` to `out` as bytes: a message head being written.
pub fn push_ip_bytes(out: &mut Vec<u8>, ip: IpAddr) {
    write_ip(out, ip);
}

/// Where an address's text goes: a `String` (a key, a log line) or a message head's bytes.
trait TextOut {
    /// ASCII bytes (an IPv4 address's digits and dots).
    fn push_ascii(&mut self, ascii: &[u8]);
    fn push_display(&mut self, ip: IpAddr);
}

impl TextOut for String {
    fn push_ascii(&mut self, ascii: &[u8]) {
        self.push_str(std::str::from_utf8(ascii).unwrap_or_default());
    }

    fn push_display(&mut self, ip: IpAddr) {
        use fmt::Write;
        let _ = write!(self, "{ip}");
    }
}

impl TextOut for Vec<u8> {
    fn push_ascii(&mut self, ascii: &[u8]) {
        self.extend_from_slice(ascii);
    }

    fn push_display(&mut self, ip: IpAddr) {
        use std::io::Write;
        let _ = write!(self, "{ip}");
    }
}

/// IPv4 digit by digit on the stack, then into the destination at once (a push per digit checked the room each
/// time); IPv6 as `Display` writes it.
fn write_ip(out: &mut impl TextOut, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        out.push_display(ip);
        return;
    };
    let mut text = [0u8; 15];
    let mut length = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[length] = b'.';
            length += 1;
        }
        if octet >= 100 {
            text[length] = b'0' + octet / 100;
            length += 1;
        }
        if octet >= 10 {
            text[length] = b'0' + octet / 10 % 10;
            length += 1;
        }
        text[length] = b'0' + octet % 10;
        length += 1;
    }
    out.push_ascii(&text[..length]);
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

/// The hops of the field `header` names, nearest last, as text (an entry that is no address stays, to stop the
/// walk): every field line as one list (RFC 9110 §5.3). A line that is not text is one malformed hop.
pub fn believed_hops(header: ClientIpHeader, headers: &HeaderMap) -> Vec<String> {
    let mut hops = Vec::new();
    match header {
        ClientIpHeader::XForwardedFor => {
            for line in headers.get_all("x-forwarded-for") {
                match line.to_str() {
                    Ok(text) => hops.extend(text.split(',').map(|hop| hop.trim().to_owned())),
                    Err(_) => hops.push(String::new()),
                }
            }
        }
        ClientIpHeader::Forwarded => {
            for line in headers.get_all(http::header::FORWARDED) {
                match line.to_str() {
                    Ok(text) => {
                        for element in split_unquoted(text, b',') {
                            if element.trim().is_empty() {
                                continue;
                            }
                            hops.push(forwarded_for(element).unwrap_or_default());
                        }
                    }
                    Err(_) => hops.push(String::new()),
                }
            }
        }
        ClientIpHeader::XRealIp => {
            let mut lines = headers.get_all("x-real-ip").iter();
            if let Some(line) = lines.next() {
                // One address, on one line: anything else has no single reading.
                let text = line
                    .to_str()
                    .ok()
                    .map(str::trim)
                    .filter(|t| !t.contains(',') && !t.is_empty());
                let single = lines.next().is_none();
                hops.push(text.filter(|_| single).unwrap_or_default().to_owned());
            }
        }
    }
    hops
}

/// The parts of `text` between the `separator`s that stand outside quoted strings (RFC 9110 §5.6.4: a quoted
/// string may hold commas and semicolons, and `\"` inside it is a quote).
fn split_unquoted(text: &str, separator: u8) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    let mut ends = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if !quoted && b == separator {
            ends.push((start, i));
            start = i + 1;
        }
    }
    ends.push((start, bytes.len()));
    ends.into_iter().map(move |(from, to)| &text[from..to])
}

/// The `for=` value of one `Forwarded` element (RFC 7239), unquoted; `None` when absent. An obfuscated or malformed
/// value stays as it is, and stops the walk.
fn forwarded_for(element: &str) -> Option<String> {
    let (_, value) = split_unquoted(element, b';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))?;
    let value = value.trim();
    let unquoted = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => value.to_owned(),
    };
    Some(unquoted)
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
            "::ffff:192.0.2.1",
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert_eq!(ip_text(ip), ip.to_string());
            let mut bytes = Vec::new();
            push_ip_bytes(&mut bytes, ip);
            assert_eq!(bytes, ip.to_string().as_bytes());
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

    fn believing(header: ClientIpHeader) -> ClientIpResolver {
        resolver().with_header(header)
    }

    fn fields(fields: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn only_the_field_named_by_client_ip_header_is_believed() {
        let all = fields(&[
            ("x-forwarded-for", "198.51.100.7"),
            (
                "forwarded",
                "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"",
            ),
            ("x-real-ip", "203.0.113.5"),
        ]);
        let peer = ip("10.0.0.1");
        assert_eq!(
            believing(ClientIpHeader::XForwardedFor).resolve(peer, &all),
            ip("198.51.100.7")
        );
        assert_eq!(
            believing(ClientIpHeader::Forwarded).resolve(peer, &all),
            ip("2001:db8::1")
        );
        assert_eq!(
            believing(ClientIpHeader::XRealIp).resolve(peer, &all),
            ip("203.0.113.5")
        );
        // A proxy that writes X-Forwarded-For passes a client's Forwarded through: never believed.
        let spoofed = fields(&[("forwarded", "for=10.9.9.9"), ("x-real-ip", "10.9.9.9")]);
        assert_eq!(
            believing(ClientIpHeader::XForwardedFor).resolve(peer, &spoofed),
            peer
        );
    }

    #[test]
    fn forwarded_is_split_outside_quoted_strings() {
        // The comma and the semicolon inside the quotes belong to the value; the client is the last element's.
        let headers = fields(&[(
            "forwarded",
            "for=198.51.100.1;by=\"a;b\", for=203.0.113.7;host=\"h,for=198.51.100.66\"",
        )]);
        assert_eq!(
            believing(ClientIpHeader::Forwarded).resolve(ip("10.0.0.1"), &headers),
            ip("203.0.113.7")
        );
        let hops = believed_hops(ClientIpHeader::Forwarded, &headers);
        assert_eq!(hops, ["198.51.100.1", "203.0.113.7"]);
    }

    #[test]
    fn x_real_ip_is_one_address_on_one_line() {
        let peer = ip("10.0.0.1");
        for bad in [
            fields(&[("x-real-ip", "203.0.113.5, 198.51.100.1")]),
            fields(&[("x-real-ip", "203.0.113.5"), ("x-real-ip", "198.51.100.1")]),
            fields(&[("x-real-ip", "garbage")]),
        ] {
            assert_eq!(believing(ClientIpHeader::XRealIp).resolve(peer, &bad), peer);
        }
    }
}
