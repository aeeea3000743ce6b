//! HTTP/2 written by hand, frame by frame, for the requests and stalls no client library would send.

/// What an HTTP/2 client sends first.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The header block of `GET /api` with `:authority: a`, as HPACK literals without indexing (each block stands
/// alone).
pub const GET_API_BLOCK: &[u8] = &[
    0x82, 0x86, 0x04, 0x04, b'/', b'a', b'p', b'i', 0x01, 0x01, b'a',
];

/// One HTTP/2 frame on `stream_id`.
pub fn h2_frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("a short payload");
    let mut frame = length.to_be_bytes()[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream_id.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}
