//! Answer fields written ahead as the lines of an HTTP/1.1 head, for the server that writes its heads itself.

use http::header::HeaderName;

/// Fields an answer carries as `name: value` lines already written (each ending with CRLF), beside it: the
/// server's own HTTP/1.1 writer copies them after the map's fields as they are, which spares a map insertion and a
/// re-encoding per field. Only the entry point whose answers that writer sends gives a request these (in the
/// buffer its connection's last answer used); every other answer carries its fields in its map.
#[derive(Debug, Clone, Default)]
pub struct HeadLines(Vec<u8>);

impl HeadLines {
    /// Lines written into `buffer`, after what it holds.
    pub fn from_buffer(buffer: Vec<u8>) -> Self {
        Self(buffer)
    }

    /// The lines' bytes, in their allocation.
    pub fn into_buffer(self) -> Vec<u8> {
        self.0
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
