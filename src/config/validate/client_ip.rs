//! The `client_ip:` section: trusted proxies, the field they write, the IPv6 prefix that keys a client.

use super::checks::networks;
use super::issues::Issues;
use crate::config::model::*;
use crate::config::raw::*;

pub(super) fn client_ip(issues: &mut Issues, raw: &RawClientIp) -> Option<ClientIpSettings> {
    let trusted_proxies = networks(issues, "client_ip.trusted_proxies", &raw.trusted_proxies)?;
    let ipv6_prefix = match raw.ipv6_prefix {
        None => ClientIpSettings::default().ipv6_prefix,
        Some(bits @ 1..=128) => u8::try_from(bits).ok()?,
        Some(bits) => {
            issues.add(
                "client_ip.ipv6_prefix",
                format_args!("must be between 1 and 128 bits (got {bits}; 64 keys each /64, 128 each address)"),
            );
            return None;
        }
    };
    Some(ClientIpSettings {
        trusted_proxies,
        ipv6_prefix,
        forwarded: raw.forwarded,
        header: match raw.header {
            RawClientIpHeader::XForwardedFor => ClientIpHeader::XForwardedFor,
            RawClientIpHeader::Forwarded => ClientIpHeader::Forwarded,
            RawClientIpHeader::XRealIp => ClientIpHeader::XRealIp,
        },
    })
}
