//! Answer fields written ahead as the lines of an HTTP/1.1 head, for the server that writes its heads itself.

/// Fields an answer carries as `name: value` lines already written (each ending with CRLF), beside it: the
/// server's own HTTP/1.1 writer copies them after the map's fields as they are, which spares a map insertion and a
/// re-encoding per field. Only the entry point whose answers that writer sends gives a request these (in the
/// buffer its connection's last answer used); every other answer carries its fields in its map.
#[derive(Debug, Clone, Default)]
pub struct HeadLines {
    bytes: Vec<u8>,
    /// The lines hold the rate-limit fields, which replace any the answer's map has (an upstream's own).
    rate_limit_fields: bool,
}

impl HeadLines {
    /// Lines written into `buffer`, after what it holds.
    pub fn from_buffer(buffer: Vec<u8>) -> Self {
        Self {
            bytes: buffer,
            rate_limit_fields: false,
        }
    }

    /// The lines' bytes, in their allocation.
    pub fn into_buffer(self) -> Vec<u8> {
        self.bytes
    }

    /// Says that the lines hold the rate-limit fields: the answer's own give way to them.
    pub fn hold_rate_limit_fields(&mut self) {
        self.rate_limit_fields = true;
    }

    /// Whether the lines hold the rate-limit fields.
    pub fn holds_rate_limit_fields(&self) -> bool {
        self.rate_limit_fields
    }

    /// Adds a line from its start (`name: ` and what else is written ahead) and its end, CRLF after it.
    pub fn push_line(&mut self, start: &[u8], end: &[u8]) {
        self.bytes.extend_from_slice(start);
        self.bytes.extend_from_slice(end);
        self.bytes.extend_from_slice(b"\r\n");
    }

    /// Adds bytes as they are: whole lines, or the start of one that a [`push_line`](Self::push_line) ends.
    pub fn push_raw(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// The lines, as they go into the head.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl AsRef<[u8]> for HeadLines {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}
