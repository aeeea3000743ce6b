//! Answer fields written ahead as the lines of an HTTP/1.1 head, for the server that writes its heads itself.

use http::header::HeaderName;

/// Fields an answer carries as `name: value` lines already written (each ending with CRLF), in its extensions:
/// the server's own HTTP/1.1 writer copies them after the map's fields as they are, which spares a map insertion
/// and a re-encoding per field. Only an entry point whose answers that writer sends asks for them (see
/// `FieldsAs`); every other answer carries its fields in its map.
#[derive(Debug, Clone, Default)]
pub struct HeadLines(Vec<u8>);

impl HeadLines {
    /// Room for about `bytes` bytes of lines.
    pub fn with_capacity(bytes: usize) -> Self {
        Self(Vec::with_capacity(bytes))
    }

    /// Adds `name: value`. The value's bytes are those of a valid header value (the callers write digits or a
    /// `HeaderValue`'s bytes).
    pub fn push(&mut self, name: &HeaderName, value: &[u8]) {
        self.push_parts(name, &[value]);
    }

    /// Adds `name:` with a value made of `parts` in order.
    pub fn push_parts(&mut self, name: &HeaderName, parts: &[&[u8]]) {
        self.0.extend_from_slice(name.as_str().as_bytes());
        self.0.extend_from_slice(b": ");
        for part in parts {
            self.0.extend_from_slice(part);
        }
        self.0.extend_from_slice(b"\r\n");
    }

    /// The lines, as they go into the head.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl AsRef<[u8]> for HeadLines {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Where an entry point wants an answer's rate-limit fields: in its map, or as [`HeadLines`] for the server's own
/// HTTP/1.1 writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldsAs {
    Map,
    Lines,
}
