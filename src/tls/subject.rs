//! A client certificate's subject written as RFC 4514 writes a distinguished name, and its common name.

use std::fmt::Write;

use super::x509::{tbs, Der};
use crate::key::ClientCertificate;

/// The attribute types RFC 4514 §3 names by a short name; any other is written as its dotted OID.
const SHORT_NAMES: [(&[u8], &str); 9] = [
    (&[0x55, 0x04, 0x03], "CN"),
    (&[0x55, 0x04, 0x07], "L"),
    (&[0x55, 0x04, 0x08], "ST"),
    (&[0x55, 0x04, 0x0a], "O"),
    (&[0x55, 0x04, 0x0b], "OU"),
    (&[0x55, 0x04, 0x06], "C"),
    (&[0x55, 0x04, 0x09], "STREET"),
    (
        &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19],
        "DC",
    ),
    (
        &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01],
        "UID",
    ),
];

/// `commonName`, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// What tollgate reads of the DER client certificate `der`, verified by the handshake: its subject and common name;
/// `None` when it is not a certificate.
pub fn client_certificate(der: &[u8]) -> Option<ClientCertificate> {
    let subject = tbs(der)?.subject;
    let mut rdns = Vec::new();
    let mut names = Der(subject);
    while let Some((_, rdn)) = names.next() {
        rdns.push(rdn);
    }
    let mut text = String::new();
    let mut common_name = None;
    // RFC 4514 §2.1: the last RDN of the sequence is written first.
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            text.push(',');
        }
        let mut attributes = Der(rdn);
        let mut first = true;
        while let Some((_, attribute)) = attributes.next() {
            if !first {
                text.push('+');
            }
            first = false;
            let mut attribute = Der(attribute);
            let (_, oid) = attribute.next()?;
            let (tag, contents, element) = attribute.next_element()?;
            let value = string_value(tag, contents);
            // The last `CN` in the sequence is the most specific (written first here, so kept when first seen).
            if oid == COMMON_NAME && common_name.is_none() {
                common_name.clone_from(&value);
            }
            push_attribute(&mut text, oid, value.as_deref(), element);
        }
    }
    Some(ClientCertificate::new(text, common_name))
}

/// Appends `type=value`: a short name and the escaped string, or (RFC 4514 §2.4) a type without a short name, or a
/// value that is not a string, as the dotted OID and `#` with the hex of the value's DER.
fn push_attribute(out: &mut String, oid: &[u8], value: Option<&str>, element: &[u8]) {
    let short = SHORT_NAMES
        .iter()
        .find(|(known, _)| *known == oid)
        .map(|(_, name)| *name);
    match (short, value) {
        (Some(name), Some(value)) => {
            out.push_str(name);
            out.push('=');
            push_escaped(out, value);
        }
        _ => {
            push_dotted(out, oid);
            out.push_str("=#");
            for byte in element {
                let _ = write!(out, "{byte:02x}");
            }
        }
    }
}

/// A directory string's text: UTF8String, PrintableString, IA5String, VisibleString, NumericString, TeletexString
/// (read as Latin-1, as OpenSSL does), BMPString (UTF-16) or UniversalString (UTF-32); `None` for any other type.
fn string_value(tag: u8, contents: &[u8]) -> Option<String> {
    match tag {
        0x0c | 0x12 | 0x13 | 0x16 | 0x1a => std::str::from_utf8(contents).ok().map(str::to_owned),
        0x14 => Some(contents.iter().map(|&b| char::from(b)).collect()),
        0x1e => {
            let units = contents
                .chunks_exact(2)
                .map(|pair| u16::from_be_bytes([pair[0], pair[1]]));
            contents
                .len()
                .is_multiple_of(2)
                .then(|| {
                    char::decode_utf16(units)
                        .collect::<Result<String, _>>()
                        .ok()
                })
                .flatten()
        }
        0x1c => contents
            .len()
            .is_multiple_of(4)
            .then(|| {
                contents
                    .chunks_exact(4)
                    .map(|quad| {
                        char::from_u32(u32::from_be_bytes([quad[0], quad[1], quad[2], quad[3]]))
                    })
                    .collect::<Option<String>>()
            })
            .flatten(),
        _ => None,
    }
}

/// Appends `value` escaped as RFC 4514 §2.4 says: `"+,;<>\` anywhere, `#` or a space first, a space last, and NUL.
fn push_escaped(out: &mut String, value: &str) {
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            c => out.push(c),
        }
    }
}

/// Appends the object identifier `oid` (its DER contents) in dotted decimal.
fn push_dotted(out: &mut String, oid: &[u8]) {
    let mut arcs: Vec<u128> = Vec::new();
    let mut arc: u128 = 0;
    for &byte in oid {
        arc = (arc << 7) | u128::from(byte & 0x7f);
        if byte & 0x80 == 0 {
            arcs.push(arc);
            arc = 0;
        }
    }
    let Some((&first, rest)) = arcs.split_first() else {
        return;
    };
    let (top, second) = match first {
        0..=39 => (0, first),
        40..=79 => (1, first - 40),
        _ => (2, first - 80),
    };
    let _ = write!(out, "{top}.{second}");
    for arc in rest {
        let _ = write!(out, ".{arc}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate with `subject` (in DER order), self-signed by rcgen.
    fn der_with(subject: &[(rcgen::DnType, rcgen::DnValue)]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), value.clone());
        }
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn the_subject_is_written_last_rdn_first_with_its_values_escaped() {
        use rcgen::{DnType, DnValue};
        let der = der_with(&[
            (
                DnType::CountryName,
                DnValue::PrintableString("DE".try_into().expect("printable")),
            ),
            (
                DnType::OrganizationName,
                DnValue::Utf8String("Example, Inc.".into()),
            ),
            (DnType::CommonName, DnValue::Utf8String("#1 Zoë".into())),
            (
                DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
                DnValue::Ia5String("a@example.com".try_into().expect("ia5")),
            ),
        ]);
        let certificate = client_certificate(&der).expect("a certificate");
        assert_eq!(
            certificate.subject(),
            "1.2.840.113549.1.9.1=#160d61406578616d706c652e636f6d,CN=\\#1 Zoë,O=Example\\, Inc.,C=DE"
        );
        assert_eq!(certificate.common_name(), Some("#1 Zoë"));
        let unnamed = client_certificate(&der_with(&[])).expect("a certificate");
        assert_eq!((unnamed.subject(), unnamed.common_name()), ("", None));
        assert_eq!(client_certificate(b"not der"), None);
    }

    #[test]
    fn values_are_escaped_as_rfc_4514_says() {
        let escaped = |value: &str| {
            let mut out = String::new();
            push_escaped(&mut out, value);
            out
        };
        assert_eq!(escaped("Example, Inc."), "Example\\, Inc.");
        assert_eq!(escaped("#1 a+b"), "\\#1 a\\+b");
        assert_eq!(escaped(" padded "), "\\ padded\\ ");
        assert_eq!(escaped("a#b\"c\\"), "a#b\\\"c\\\\");
        assert_eq!(escaped("Zoë"), "Zoë");
    }

    #[test]
    fn oids_are_written_in_dotted_decimal() {
        let dotted = |oid: &[u8]| {
            let mut out = String::new();
            push_dotted(&mut out, oid);
            out
        };
        assert_eq!(dotted(&[0x55, 0x04, 0x03]), "2.5.4.3");
        assert_eq!(
            dotted(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01]),
            "1.2.840.113549.1.9.1"
        );
        assert_eq!(
            dotted(&[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19]),
            "0.9.2342.19200300.100.1.25"
        );
    }

    #[test]
    fn strings_of_every_directory_type_are_read() {
        assert_eq!(string_value(0x13, b"DE").as_deref(), Some("DE"));
        assert_eq!(string_value(0x14, b"Zo\xeb").as_deref(), Some("Zoë"));
        assert_eq!(
            string_value(0x1e, &[0, b'Z', 0, 0xeb]).as_deref(),
            Some("Zë")
        );
        assert_eq!(string_value(0x1c, &[0, 0, 0, b'Z']).as_deref(), Some("Z"));
        assert_eq!(string_value(0x0c, b"\xff"), None);
        assert_eq!(string_value(0x04, b"x"), None);
    }
}
