//! What the TLS listener reads from its own certificates: when each expires and the DNS names it holds.

use crate::civil::{civil_from_days, days_from_civil};

/// A certificate's expiry and DNS names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Facts {
    /// `notAfter`, in seconds since the Unix epoch.
    pub not_after: i64,
    /// The `dNSName` entries of its subject alternative names.
    pub dns_names: Vec<String>,
}

/// DER elements read one after another.
pub(super) struct Der<'a>(pub(super) &'a [u8]);

/// The subject alternative name extension's object identifier, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// The fields of a certificate's `tbsCertificate` that tollgate reads.
pub(super) struct Tbs<'a> {
    /// The contents of `validity`.
    validity: &'a [u8],
    /// The contents of `subject`, a `Name`.
    pub(super) subject: &'a [u8],
    /// What follows `subjectPublicKeyInfo`: the optional unique ids and `[3]` extensions.
    rest: Der<'a>,
}

/// The facts of the DER certificate `der`; `None` when it is not one.
///
/// The certificates are the operator's own, already accepted by rustls as they are loaded: reading the two fields
/// here is simpler than a whole X.509 parser in the tree for them.
pub(crate) fn facts(der: &[u8]) -> Option<Facts> {
    let mut tbs = tbs(der)?;
    let mut validity = Der(tbs.validity);
    validity.next()?;
    let (tag, not_after) = validity.next()?;
    let not_after = unix_seconds(tag, not_after)?;
    let mut dns_names = Vec::new();
    while let Some((tag, contents)) = tbs.rest.next() {
        if tag == 0xa3 {
            dns_names = alt_dns_names(contents).unwrap_or_default();
        }
    }
    Some(Facts {
        not_after,
        dns_names,
    })
}

/// The fields of the DER certificate `der` up to its subject; `None` when it is not one.
pub(super) fn tbs(der: &[u8]) -> Option<Tbs<'_>> {
    let (_, certificate) = Der(der).next()?;
    let (_, tbs) = Der(certificate).next()?;
    let mut tbs = Der(tbs);
    let (tag, _) = tbs.next()?;
    // `version [0]` is optional: when present, the serial number comes next.
    if tag == 0xa0 {
        tbs.next()?;
    }
    tbs.next()?; // signature
    tbs.next()?; // issuer
    let (_, validity) = tbs.next()?;
    let (_, subject) = tbs.next()?;
    tbs.next()?; // subjectPublicKeyInfo
    Some(Tbs {
        validity,
        subject,
        rest: tbs,
    })
}

/// `seconds` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn format_utc(seconds: i64) -> String {
    let (days, time) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        time / 3600,
        time / 60 % 60,
        time % 60
    )
}

// === impl Der ===

impl<'a> Der<'a> {
    /// The next element's tag and contents.
    pub(super) fn next(&mut self) -> Option<(u8, &'a [u8])> {
        self.next_element()
            .map(|(tag, contents, _)| (tag, contents))
    }

    /// The next element's tag, contents, and the whole element (tag and length included).
    pub(super) fn next_element(&mut self) -> Option<(u8, &'a [u8], &'a [u8])> {
        let whole = self.0;
        let (&tag, rest) = self.0.split_first()?;
        let (&first, mut rest) = rest.split_first()?;
        let length = if first < 0x80 {
            usize::from(first)
        } else {
            let bytes = usize::from(first & 0x7f);
            if bytes == 0 || bytes > 4 || rest.len() < bytes {
                return None;
            }
            let length = rest[..bytes]
                .iter()
                .fold(0usize, |length, &b| (length << 8) | usize::from(b));
            rest = &rest[bytes..];
            length
        };
        if rest.len() < length {
            return None;
        }
        let (contents, rest) = rest.split_at(length);
        let element = &whole[..whole.len() - rest.len()];
        self.0 = rest;
        Some((tag, contents, element))
    }
}

/// The `dNSName`s of the subject alternative names among `extensions` (the contents of `[3]`).
fn alt_dns_names(extensions: &[u8]) -> Option<Vec<String>> {
    let (_, list) = Der(extensions).next()?;
    let mut list = Der(list);
    while let Some((_, extension)) = list.next() {
        let mut extension = Der(extension);
        let (_, oid) = extension.next()?;
        if oid != SUBJECT_ALT_NAME {
            continue;
        }
        let (mut tag, mut value) = extension.next()?;
        // The optional `critical` boolean.
        if tag == 0x01 {
            (tag, value) = extension.next()?;
        }
        if tag != 0x04 {
            return None;
        }
        let (_, names) = Der(value).next()?;
        let mut names = Der(names);
        let mut found = Vec::new();
        while let Some((tag, name)) = names.next() {
            // `dNSName [2] IA5String`, implicitly tagged.
            if tag == 0x82 {
                found.push(String::from_utf8_lossy(name).into_owned());
            }
        }
        return Some(found);
    }
    None
}

/// A UTCTime (`YYMMDDHHMMSSZ`, tag 0x17) or GeneralizedTime (`YYYYMMDDHHMMSSZ`, tag 0x18) in Unix seconds.
fn unix_seconds(tag: u8, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let number = |from: usize, to: usize| text.get(from..to)?.parse::<i64>().ok();
    let (year, at) = match tag {
        // RFC 5280: two-digit years from 50 are 19xx.
        0x17 => (
            number(0, 2).map(|yy| if yy < 50 { 2000 + yy } else { 1900 + yy })?,
            2,
        ),
        0x18 => (number(0, 4)?, 4),
        _ => return None,
    };
    if text.len() != at + 10 {
        return None;
    }
    let field = |i: usize| number(at + 2 * i, at + 2 * i + 2);
    let (month, day) = (field(0)?, field(1)?);
    let (hour, minute, second) = (field(2)?, field(3)?, field(4)?);
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_and_read_both_time_forms() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(unix_seconds(0x17, b"240229123456Z"), Some(1_709_210_096));
        assert_eq!(unix_seconds(0x18, b"20240229123456Z"), Some(1_709_210_096));
        assert_eq!(
            unix_seconds(0x17, b"990101000000Z")
                .map(format_utc)
                .as_deref(),
            Some("1999-01-01T00:00:00Z")
        );
        assert_eq!(unix_seconds(0x18, b"2024022912345Z"), None);
    }
}
