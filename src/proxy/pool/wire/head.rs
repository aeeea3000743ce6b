//! The heads of an exchange: the request's written from its parts (with the body's framing), the answer's parsed
//! into `http` types (with its body's framing and whether the connection stays open).

use std::mem::MaybeUninit;

use axum::body::Body;
use bytes::BytesMut;
use http::header::{self, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Version};
use http_body::Body as _;
use smallvec::SmallVec;

use super::decode::Decoder;
use super::WireError;
use crate::proxy::headers::HopFields;
use crate::server::body_framing::Framing;

/// Header fields an answer may have (hyper's limit too).
const MAX_HEADERS: usize = 100;
/// The largest answer head read: past it the answer is refused as malformed.
const MAX_HEAD_BYTES: usize = 256 * 1024;

/// A parsed answer head.
pub(in crate::proxy::pool) struct ResponseHead {
    pub(in crate::proxy::pool) status: StatusCode,
    pub(in crate::proxy::pool) version: Version,
    /// The answer's fields, but a `Connection` field that only says `keep-alive` or `close` (read into
    /// `keep_alive`, and hop-by-hop).
    pub(in crate::proxy::pool) headers: HeaderMap,
    pub(in crate::proxy::pool) body: Decoder,
    /// Whether the connection may carry another request once this answer has been read.
    pub(in crate::proxy::pool) keep_alive: bool,
}

/// Writes `request`'s head into `out` (cleared first), with tollgate's fields about the hop (`hop`) after the
/// request's own, and says how its body goes: a `Content-Length` the request carries is kept; a body of known size
/// without one gets one; any other body is chunked. The request's own `Transfer-Encoding` (a hop-by-hop field,
/// normally removed already) is never written: the framing is this hop's.
pub(in crate::proxy::pool) fn write_request_head(
    request: &Request<Body>,
    hop: &HopFields,
    out: &mut Vec<u8>,
) -> Framing {
    out.clear();
    out.extend_from_slice(request.method().as_str().as_bytes());
    out.push(b' ');
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |target| target.as_str());
    out.extend_from_slice(if target.is_empty() {
        b"/"
    } else {
        target.as_bytes()
    });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut declared = None;
    for (name, value) in request.headers() {
        if name == TRANSFER_ENCODING {
            continue;
        }
        if name == CONTENT_LENGTH {
            declared = content_length(value);
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    hop.write(out);
    let body = request.body();
    let framing = if body.is_end_stream() {
        Framing::Nothing
    } else if let Some(length) = declared {
        Framing::Length(length)
    } else if let Some(length) = body.size_hint().exact() {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
        out.extend_from_slice(b"\r\n");
        Framing::Length(length)
    } else {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Framing::Chunked
    };
    out.extend_from_slice(b"\r\n");
    framing
}

/// The answer head at the start of `buffer`, taken out of it, or `None` while it is incomplete. Interim answers
/// (`1xx` but `101`) are skipped: the client gets the final one. `head_request`: the request was a `HEAD` (an
/// answer to it has no body whatever its fields say).
///
/// The answer's fields go into `room`'s allocation, taken (and cleared) once the head is complete: the request's
/// own map, no longer needed once its head is written and its answer has come. Its fields, then the answer's,
/// then (hyper keeps a written answer's map for the next request it reads) the next request's share one
/// allocation, where a map per answer cost an allocation and a free of two blocks each.
pub(in crate::proxy::pool) fn parse_response_head(
    buffer: &mut BytesMut,
    head_request: bool,
    room: &mut HeaderMap,
) -> Result<Option<ResponseHead>, WireError> {
    loop {
        let mut fields: [MaybeUninit<httparse::Header<'_>>; MAX_HEADERS] =
            [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut []);
        let base = buffer.as_ptr() as usize;
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut response,
            buffer,
            &mut fields,
        )?;
        let httparse::Status::Complete(length) = parsed else {
            if buffer.len() > MAX_HEAD_BYTES {
                return Err(WireError::HeadTooLarge(MAX_HEAD_BYTES));
            }
            return Ok(None);
        };
        let code = response.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| WireError::Malformed("invalid status"))?;
        if status.is_informational() {
            if status == StatusCode::SWITCHING_PROTOCOLS {
                // Only a WebSocket handshake asks to switch, and it never goes through a pooled connection.
                return Err(WireError::Malformed(
                    "101 to a request that asked for no upgrade",
                ));
            }
            let _ = buffer.split_to(length);
            continue;
        }
        let version = match response.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // Each field's name and value as offsets into the head, read while the parser borrows the buffer. Room
        // for the usual few fields without zeroing room for a hundred.
        let mut spans: SmallVec<[(u32, u32, u32, u32); 16]> = SmallVec::new();
        spans.extend(response.headers.iter().map(|field| {
            let name = field.name.as_ptr() as usize - base;
            let value = field.value.as_ptr() as usize - base;
            (
                name as u32,
                field.name.len() as u32,
                value as u32,
                field.value.len() as u32,
            )
        }));
        let count = spans.len();
        // Values point into the head's bytes, frozen once: no copy per field.
        let head = buffer.split_to(length).freeze();
        let mut headers = std::mem::take(room);
        headers.clear();
        headers.reserve(count);
        // The fields that frame the body and say whether the connection stays, read as they go into the map:
        // looking each up again afterwards hashed its name and walked its values a second time.
        let mut framing = FramingFields::default();
        for &(name, name_length, value, value_length) in &spans {
            let (name, value) = (name as usize, value as usize);
            let name = field_name(&head[name..name + name_length as usize])
                .ok_or(WireError::Malformed("invalid header name"))?;
            let value =
                HeaderValue::from_maybe_shared(head.slice(value..value + value_length as usize))
                    .map_err(|_| WireError::Malformed("invalid header value"))?;
            if framing.read(&name, &value) {
                headers.append(name, value);
            }
        }
        let body = framing.body(head_request, status)?;
        let keep_alive = !body.reads_until_close() && framing.persistent(version);
        return Ok(Some(ResponseHead {
            status,
            version,
            headers,
            body,
            keep_alive,
        }));
    }
}

/// A field's name: the ones nearly every answer carries, in the spellings servers write them, without the general
/// parse (which lowercases the name into a scratch buffer before it looks it up), any other through it.
#[inline]
fn field_name(bytes: &[u8]) -> Option<HeaderName> {
    let known = match bytes {
        b"Date" | b"date" => header::DATE,
        b"Server" | b"server" => header::SERVER,
        b"Connection" | b"connection" => CONNECTION,
        b"Content-Type" | b"content-type" => header::CONTENT_TYPE,
        b"Content-Length" | b"content-length" => CONTENT_LENGTH,
        b"Transfer-Encoding" | b"transfer-encoding" => TRANSFER_ENCODING,
        _ => return HeaderName::from_bytes(bytes).ok(),
    };
    Some(known)
}

/// What an answer's `Transfer-Encoding`, `Content-Length` and `Connection` fields say, read field by field in
/// their order.
#[derive(Default)]
struct FramingFields {
    /// Whether the last `Transfer-Encoding` field's final coding is `chunked`; `None` without the field.
    chunked: Option<bool>,
    /// The length every `Content-Length` item agrees on, or the first reason they do not.
    length: Option<Result<u64, &'static str>>,
    /// Whether a `Connection` field lists `close`, or `keep-alive`.
    close: bool,
    keep_alive: bool,
}

impl FramingFields {
    /// Notes what the field `name: value` says of the framing, if anything, and says whether the field goes into
    /// the answer's map: a `Connection` field that only says `keep-alive` or `close` does not. It names no other
    /// field, and it is hop-by-hop (the proxy removes it before the answer goes on), so taking it out here spares
    /// its insertion, then its lookup and removal; what it says is in `keep_alive`.
    #[inline]
    fn read(&mut self, name: &HeaderName, value: &HeaderValue) -> bool {
        if *name == TRANSFER_ENCODING {
            self.chunked = Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|codings| codings.rsplit(',').next())
                    .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked")),
            );
        } else if *name == CONTENT_LENGTH {
            self.read_length(value);
        } else if *name == CONNECTION {
            return self.read_connection(value);
        }
        true
    }

    fn read_length(&mut self, value: &HeaderValue) {
        if let Some(Err(_)) = self.length {
            return;
        }
        let Ok(value) = value.to_str() else {
            self.length = Some(Err("invalid Content-Length"));
            return;
        };
        // Nearly every one is a number alone: the list it would be read as has that one item.
        if let Some(parsed) = content_length_item(value) {
            self.note_length(parsed);
            return;
        }
        for item in value.split(',') {
            let Some(parsed) = content_length_item(item.trim()) else {
                self.length = Some(Err("invalid Content-Length"));
                return;
            };
            self.note_length(parsed);
            if let Some(Err(_)) = self.length {
                return;
            }
        }
    }

    /// Notes one `Content-Length` item: the length, or a conflict with the one seen before.
    fn note_length(&mut self, parsed: u64) {
        self.length = Some(match self.length {
            Some(Ok(seen)) if seen != parsed => Err("conflicting Content-Length fields"),
            _ => Ok(parsed),
        });
    }

    /// Reads a `Connection` field; whether it names anything but `keep-alive` or `close` (then it stays, so
    /// that the fields it names are removed with it).
    fn read_connection(&mut self, value: &HeaderValue) -> bool {
        // Nearly every answer says `keep-alive` alone, in lower case: one comparison.
        let bytes = value.as_bytes();
        if bytes == b"keep-alive" || bytes.eq_ignore_ascii_case(b"keep-alive") {
            self.keep_alive = true;
            return false;
        }
        if bytes.eq_ignore_ascii_case(b"close") {
            self.close = true;
            return false;
        }
        let Ok(value) = value.to_str() else {
            return true;
        };
        for item in value.split(',') {
            let item = item.trim();
            self.close |= item.eq_ignore_ascii_case("close");
            self.keep_alive |= item.eq_ignore_ascii_case("keep-alive");
        }
        true
    }

    /// How the answer's body is framed (RFC 9112 §6.3).
    fn body(&self, head_request: bool, status: StatusCode) -> Result<Decoder, WireError> {
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return Ok(Decoder::empty());
        }
        if let Some(chunked) = self.chunked {
            // Another final coding is delimited by the close (RFC 9112 §6.3, item 4).
            return Ok(if chunked {
                Decoder::chunked()
            } else {
                Decoder::until_close()
            });
        }
        Ok(match self.length {
            Some(Ok(length)) => Decoder::length(length),
            Some(Err(reason)) => return Err(WireError::Malformed(reason)),
            None => Decoder::until_close(),
        })
    }

    /// Whether the connection stays open after the answer: HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with
    /// `Connection: keep-alive`.
    fn persistent(&self, version: Version) -> bool {
        if version == Version::HTTP_10 {
            self.keep_alive
        } else {
            !self.close
        }
    }
}

/// A request's `Content-Length` value, when it is one number.
fn content_length(value: &HeaderValue) -> Option<u64> {
    std::str::from_utf8(value.as_bytes())
        .ok()
        .and_then(content_length_item)
}

/// Digits only: `+1` and ` 1` are not lengths.
fn content_length_item(item: &str) -> Option<u64> {
    if item.is_empty() || !item.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    item.parse().ok()
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    fn parse(bytes: &[u8], method: Method) -> Result<Option<ResponseHead>, WireError> {
        let mut buffer = BytesMut::from(bytes);
        parse_response_head(&mut buffer, method == Method::HEAD, &mut HeaderMap::new())
    }

    #[test]
    fn a_head_is_written_with_the_framing_of_its_body() {
        let mut out = Vec::new();
        let request = Request::get("http://ignored/a/b?c=d")
            .header("host", "example")
            .header("x-two", "1")
            .header("x-two", "2")
            .header("transfer-encoding", "chunked")
            .body(Body::empty())
            .expect("request");
        assert!(matches!(
            write_request_head(&request, &HopFields::default(), &mut out),
            Framing::Nothing
        ));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /a/b?c=d HTTP/1.1\r\nhost: example\r\nx-two: 1\r\nx-two: 2\r\n\r\n"
        );
        let sized = Request::post("/p")
            .body(Body::from("12345"))
            .expect("request");
        assert!(matches!(
            write_request_head(&sized, &HopFields::default(), &mut out),
            Framing::Length(5)
        ));
        assert!(String::from_utf8_lossy(&out).ends_with("content-length: 5\r\n\r\n"));
        let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from("x"))]);
        let streamed = Request::post("/p")
            .body(Body::from_stream(stream))
            .expect("request");
        assert!(matches!(
            write_request_head(&streamed, &HopFields::default(), &mut out),
            Framing::Chunked
        ));
        assert!(String::from_utf8_lossy(&out).ends_with("transfer-encoding: chunked\r\n\r\n"));
    }

    #[test]
    fn an_answer_head_is_parsed_after_its_interim_answers() {
        let head = parse(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: b\r\n\r\nabc",
            Method::GET,
        )
        .expect("parsed")
        .expect("complete");
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.headers["x-a"], "b");
        assert!(head.keep_alive);
        assert_eq!(head.body.remaining(), Some(3));
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Le", Method::GET)
            .expect("parsed")
            .is_none());
    }

    #[test]
    fn names_read_the_same_in_any_spelling_and_lists_are_read_whole() {
        let head = |bytes: &[u8]| {
            parse(bytes, Method::GET)
                .expect("parsed")
                .expect("complete")
        };
        let answer = head(
            b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 3, 3\r\ncontent-type: a\r\nDate: d\r\nX-Other: b\r\n\r\n",
        );
        assert_eq!(answer.body.remaining(), Some(3));
        assert_eq!(answer.headers[CONTENT_LENGTH], "3, 3");
        assert_eq!(answer.headers[header::CONTENT_TYPE], "a");
        assert_eq!(answer.headers[header::DATE], "d");
        assert_eq!(answer.headers["x-other"], "b");
        // The last Transfer-Encoding field says how the body ends, whatever came before it.
        let last = head(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
        );
        assert!(!last.keep_alive);
        let chunked = head(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: Chunked\r\n\r\n",
        );
        assert!(chunked.keep_alive);
        // A `Connection` field that names no other field is read, not kept; one that does stays, for the proxy to
        // remove what it names.
        let plain = head(b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n");
        assert!(plain.keep_alive && !plain.headers.contains_key(CONNECTION));
        let closing = head(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        assert!(!closing.keep_alive && !closing.headers.contains_key(CONNECTION));
        let naming = head(
            b"HTTP/1.1 200 OK\r\nConnection: x-a, close\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(!naming.keep_alive);
        assert_eq!(naming.headers[CONNECTION], "x-a, close");
        // An invalid length is no error when the body is framed otherwise.
        assert!(parse(
            b"HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n",
            Method::GET
        )
        .is_ok());
        assert!(parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
            Method::GET
        )
        .is_err());
        assert!(parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1,\r\n\r\n",
            Method::GET
        )
        .is_err());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let head = |bytes: &[u8], method| parse(bytes, method).expect("parsed").expect("complete");
        assert!(head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
            Method::HEAD
        )
        .body
        .is_done());
        assert!(head(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n",
            Method::GET
        )
        .body
        .is_done());
        let chunked = head(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n",
            Method::GET,
        );
        assert!(chunked.keep_alive && chunked.body.remaining().is_none());
        let close = head(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            Method::GET,
        );
        assert!(!close.keep_alive);
        assert!(!head(b"HTTP/1.1 200 OK\r\n\r\n", Method::GET).keep_alive);
        assert!(
            !head(
                b"HTTP/1.1 200 OK\r\nConnection: x, Close\r\nContent-Length: 0\r\n\r\n",
                Method::GET
            )
            .keep_alive
        );
        assert!(!head(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", Method::GET).keep_alive);
        assert!(
            head(
                b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                Method::GET
            )
            .keep_alive
        );
        assert!(parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            Method::GET
        )
        .is_err());
        assert!(parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n",
            Method::GET
        )
        .is_err());
        assert!(parse(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", Method::GET).is_err());
    }
}
