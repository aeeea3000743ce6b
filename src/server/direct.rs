//! The HTTP/1.1 requests a connection answers itself, without hyper: keep-alive requests with nothing to negotiate
//! and no body, or a body of declared length that came whole with its head (nearly all an API gateway is sent).
//!
//! hyper's server parses a head, hands it through its dispatcher, then encodes the answer's head field by field
//! with checks on each: a sixth of what a proxied request cost (about 3,300 instructions of 20,700). Here the head is parsed into the map the last
//! answer was in, the handler's future is polled in place, and the answer's head is written in one pass, as the
//! upstream head already is. Anything else (a body, an upgrade, `Expect`, `HEAD`, `CONNECT`, HTTP/1.0,
//! `Connection: close`, a malformed or oversized head) goes to a hyper connection from the same bytes, which
//! serves it as before: what hyper decides for those, it still decides.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite};

use super::body_framing::{push_field, Framing, Staged};
use super::idle::REST_AFTER;

/// Fields a request head may have here (hyper's limit too): a head with more is hyper's to refuse.
const MAX_FIELDS: usize = 100;
/// The most read at a time.
const READ_CHUNK: usize = 4096;
/// Body pieces up to this size are copied after what waits to be written and go out with it; a larger one is
/// written from its own bytes.
const COPY_LIMIT: usize = 8 * 1024;
/// hyper's limit on a request target: a longer one is hyper's to refuse (414).
const MAX_TARGET: usize = 65_534;
/// The longest `Content-Length` read here, in digits: any longer is hyper's to read or refuse.
const MAX_LENGTH_DIGITS: usize = 12;

/// What the bytes read so far hold.
// Returned once per request and taken apart at once: boxing the request would cost an allocation each time.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A request answered here, with its whole body (empty when it has none); its bytes are gone from the buffer.
    Plain(Request<Bytes>),
    /// A request hyper serves, from the bytes as they are.
    Other,
}

/// Parses the request at the start of `read`. A plain request takes its fields into `room`'s allocation (the map of
/// the last answer written, cleared), and its body, when it declares one, from the bytes read with its head.
/// Anything not plain is left for hyper, which refuses it or serves it as it did before: a head over
/// `max_header_bytes` is one of those, and so is a body not read whole yet (hyper reads the rest as it comes, held
/// to the body's own timeout).
pub(super) fn parse_request(
    read: &mut BytesMut,
    max_header_bytes: usize,
    room: &mut HeaderMap,
) -> Parsed {
    let mut fields: [MaybeUninit<httparse::Header<'_>>; MAX_FIELDS] =
        [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut request = httparse::Request::new(&mut []);
    let base = read.as_ptr() as usize;
    let length = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        read,
        &mut fields,
    ) {
        // A head over the limit is hyper's: it answers 431 as it does for the heads it reads.
        Ok(httparse::Status::Complete(length)) if length <= max_header_bytes => length,
        Ok(httparse::Status::Partial) if read.len() <= max_header_bytes => return Parsed::Partial,
        _ => return Parsed::Other,
    };
    let (Some(method), Some(target), Some(1)) = (request.method, request.path, request.version)
    else {
        return Parsed::Other;
    };
    let method = match method {
        "GET" => Method::GET,
        "POST" => Method::POST,
        "PUT" => Method::PUT,
        "DELETE" => Method::DELETE,
        "PATCH" => Method::PATCH,
        "OPTIONS" => Method::OPTIONS,
        // HEAD's answer has no body whatever its fields say, CONNECT asks for a tunnel: hyper's.
        "HEAD" | "CONNECT" => return Parsed::Other,
        other => match Method::from_bytes(other.as_bytes()) {
            Ok(method) => method,
            Err(_) => return Parsed::Other,
        },
    };
    if target.len() >= MAX_TARGET {
        return Parsed::Other;
    }
    let target = (target.as_ptr() as usize - base, target.len());
    // Each field as offsets into the head, read while the parser borrows the buffer; a field that asks for more
    // than a plain exchange sends the request to hyper before anything is taken from the buffer.
    let mut spans: SmallVec<[(u32, u32, u32, u32); 16]> = SmallVec::new();
    let mut body_length = None;
    for field in request.headers.iter() {
        match field_kind(field.name.as_bytes(), field.value) {
            FieldKind::Plain => {}
            // A second length, even an equal one, is hyper's to refuse or reconcile.
            FieldKind::Length(declared) if body_length.is_none() => body_length = Some(declared),
            FieldKind::Length(_) | FieldKind::NotPlain => return Parsed::Other,
        }
        spans.push((
            (field.name.as_ptr() as usize - base) as u32,
            field.name.len() as u32,
            (field.value.as_ptr() as usize - base) as u32,
            field.value.len() as u32,
        ));
    }
    // The body, whole in what was read, or the request is hyper's to read as its bytes come.
    let body_length = body_length.unwrap_or(0);
    if read.len() - length < body_length {
        return Parsed::Other;
    }
    let head = read.split_to(length).freeze();
    let Ok(uri) = Uri::from_maybe_shared(head.slice(target.0..target.0 + target.1)) else {
        return give_back(read, head);
    };
    let mut headers = std::mem::take(room);
    headers.clear();
    headers.reserve(spans.len());
    for &(name, name_length, value, value_length) in &spans {
        let (name, value) = (name as usize, value as usize);
        let Some(name) = field_name(&head[name..name + name_length as usize]) else {
            return give_back(read, head);
        };
        let Ok(value) =
            HeaderValue::from_maybe_shared(head.slice(value..value + value_length as usize))
        else {
            return give_back(read, head);
        };
        headers.append(name, value);
    }
    let body = if body_length == 0 {
        Bytes::new()
    } else {
        read.split_to(body_length).freeze()
    };
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Parsed::Plain(request)
}

/// Puts a head taken from `read` back in front of what follows it, for hyper: a field or target `http` refuses
/// that the parser let through (rare enough for a copy).
fn give_back(read: &mut BytesMut, head: Bytes) -> Parsed {
    let mut whole = BytesMut::with_capacity(head.len() + read.len());
    whole.extend_from_slice(&head);
    whole.extend_from_slice(read);
    *read = whole;
    Parsed::Other
}

/// What a request field says of the exchange.
#[derive(Debug, PartialEq, Eq)]
enum FieldKind {
    /// Nothing that keeps it from being plain.
    Plain,
    /// A body of this many bytes (`Content-Length`, digits alone).
    Length(usize),
    /// Something for hyper: an upgrade, `Expect`, a chunked body, a connection that closes, a length it must read.
    NotPlain,
}

/// Whether a request field leaves the exchange plain: no upgrade, no `Expect`, no `Transfer-Encoding`, a body only
/// by a `Content-Length` of digits alone, and a connection that stays open (a `Connection` field that says
/// `keep-alive` alone).
#[inline]
fn field_kind(name: &[u8], value: &[u8]) -> FieldKind {
    let plain = match name.len() {
        6 if name.eq_ignore_ascii_case(b"expect") => false,
        7 if name.eq_ignore_ascii_case(b"upgrade") => false,
        10 if name.eq_ignore_ascii_case(b"connection") => value.eq_ignore_ascii_case(b"keep-alive"),
        14 if name.eq_ignore_ascii_case(b"content-length") => return declared_length(value),
        17 if name.eq_ignore_ascii_case(b"transfer-encoding") => false,
        _ => true,
    };
    if plain {
        FieldKind::Plain
    } else {
        FieldKind::NotPlain
    }
}

/// A `Content-Length` of one to `MAX_LENGTH_DIGITS` digits and nothing else (no sign, no list, no spaces, which
/// hyper reads or refuses by its own rules).
fn declared_length(value: &[u8]) -> FieldKind {
    if value.is_empty() || value.len() > MAX_LENGTH_DIGITS || !value.iter().all(u8::is_ascii_digit)
    {
        return FieldKind::NotPlain;
    }
    let length = value
        .iter()
        .fold(0u64, |length, digit| length * 10 + u64::from(digit - b'0'));
    usize::try_from(length).map_or(FieldKind::NotPlain, FieldKind::Length)
}

/// A request field's name: the ones most requests carry, in the spellings clients write, without the general
/// parse (which lowercases the name into a scratch buffer before it looks it up); any other through it.
#[inline]
fn field_name(bytes: &[u8]) -> Option<HeaderName> {
    let known = match bytes {
        b"Host" | b"host" => header::HOST,
        b"User-Agent" | b"user-agent" => header::USER_AGENT,
        b"Accept" | b"accept" => header::ACCEPT,
        b"Accept-Encoding" | b"accept-encoding" => header::ACCEPT_ENCODING,
        b"Authorization" | b"authorization" => header::AUTHORIZATION,
        b"Content-Type" | b"content-type" => header::CONTENT_TYPE,
        b"Connection" | b"connection" => header::CONNECTION,
        _ => return HeaderName::from_bytes(bytes).ok(),
    };
    Some(known)
}

/// The answer's head as hyper would write it for a GET of HTTP/1.1: its status line, its fields, then `lines` (the
/// fields the handler wrote ahead as head lines, see [`Handler::handle_bodiless`](super::Handler::handle_bodiless)),
/// the framing its body's size says where the fields do not, a `Date` where it has none, and `Connection: close`
/// when the connection closes after it. Returns the body's framing and whether the connection closes after the
/// answer.
fn write_head<B: Body>(
    response: &Response<B>,
    lines: &[u8],
    mut close: bool,
    out: &mut Vec<u8>,
) -> Result<(Framing, bool), ()> {
    let status = response.status();
    if status.is_informational() {
        // A 1xx is not an answer (hyper refuses it the same way).
        return Err(());
    }
    let http10 = response.version() == Version::HTTP_10;
    if status == StatusCode::OK && !http10 {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let body = response.body();
    let has_body = !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    let known = if body.is_end_stream() {
        Some(0)
    } else {
        body.size_hint().exact()
    };
    let mut framing = None;
    let (mut wrote_date, mut keep_alive_field, mut said_close) = (false, false, false);
    for (name, value) in response.headers() {
        match *name {
            header::CONTENT_LENGTH => {
                if framing.is_some() {
                    // A second `Content-Length` (or one after `Transfer-Encoding`): the first one stands.
                    if matches!(framing, Some(Framing::Chunked)) {
                        return Err(());
                    }
                    continue;
                }
                let length = match known {
                    Some(length) => length,
                    None => match std::str::from_utf8(value.as_bytes())
                        .ok()
                        .and_then(|text| text.parse::<u64>().ok())
                    {
                        Some(length) => length,
                        None => return Err(()),
                    },
                };
                if !has_body {
                    continue;
                }
                if known == Some(0) && length != 0 {
                    // An empty body under a non-zero length: hyper drops the field and says 0.
                    continue;
                }
                framing = Some(Framing::Length(length));
            }
            header::TRANSFER_ENCODING => {
                if framing.is_some() {
                    return Err(());
                }
                if http10 || !has_body {
                    continue;
                }
                framing = Some(Framing::Chunked);
                out.extend_from_slice(b"transfer-encoding: ");
                out.extend_from_slice(value.as_bytes());
                if !ends_chunked(value) {
                    out.extend_from_slice(b", chunked");
                }
                out.extend_from_slice(b"\r\n");
                continue;
            }
            header::CONNECTION => {
                said_close |= list_has(value, "close");
                keep_alive_field |= list_has(value, "keep-alive");
            }
            header::DATE => wrote_date = true,
            _ => {}
        }
        push_field(out, name, value);
    }
    // Fields the handler wrote as lines ahead of time (the rate-limit fields), as they are.
    out.extend_from_slice(lines);
    let framing = match framing {
        Some(framing) => framing,
        None if !has_body => Framing::Nothing,
        None => match known {
            Some(0) => {
                out.extend_from_slice(b"content-length: 0\r\n");
                Framing::Nothing
            }
            Some(length) => {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
                out.extend_from_slice(b"\r\n");
                Framing::Length(length)
            }
            None if http10 => Framing::UntilClose,
            None => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
        },
    };
    let framing = if has_body && known != Some(0) {
        framing
    } else {
        Framing::Nothing
    };
    if !wrote_date {
        out.extend_from_slice(b"date: ");
        push_date(out);
        out.extend_from_slice(b"\r\n");
    }
    // An HTTP/1.0 answer keeps the connection only when it says so; one delimited by the close ends it.
    close |= said_close || (http10 && !keep_alive_field) || framing == Framing::UntilClose;
    if close && !said_close && !http10 {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok((framing, close))
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`.
fn ends_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|codings| codings.rsplit(',').next())
        .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked"))
}

/// Whether a comma-separated field value lists `item` (case-insensitive).
fn list_has(value: &HeaderValue, item: &str) -> bool {
    value.to_str().is_ok_and(|items| {
        items
            .split(',')
            .any(|each| each.trim().eq_ignore_ascii_case(item))
    })
}

thread_local! {
    /// The current second's `Date` value, made once a second per thread.
    static DATE: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((u64::MAX, [0; 29])) };
}

/// Writes the current time as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn push_date(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let second = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    DATE.with_borrow_mut(|(made_at, text)| {
        if *made_at != second {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == text.len() {
                text.copy_from_slice(formatted.as_bytes());
                *made_at = second;
            } else {
                out.extend_from_slice(formatted.as_bytes());
                return;
            }
        }
        out.extend_from_slice(text);
    });
}

/// What answers the plain requests: the handler's future for each one (its body whole), given an empty buffer for
/// the head lines it hands back with the answer.
pub(super) trait Answer {
    type Body;
    type Future: Future<Output = Result<(Response<Self::Body>, Vec<u8>), Infallible>>;

    fn answer(&mut self, request: Request<Bytes>, lines: Vec<u8>) -> Self::Future;
}

impl<A, F, B> Answer for A
where
    A: FnMut(Request<Bytes>, Vec<u8>) -> F,
    F: Future<Output = Result<(Response<B>, Vec<u8>), Infallible>>,
{
    type Body = B;
    type Future = F;

    fn answer(&mut self, request: Request<Bytes>, lines: Vec<u8>) -> F {
        self(request, lines)
    }
}

/// What a direct turn ends with.
#[derive(Debug)]
pub(super) enum Ended {
    /// The connection is done: closed by the client, after an answer that closes it, by a timeout or shutdown.
    Closed,
    /// A request for hyper: the bytes read so far, its head first.
    HandOff(Bytes),
    /// Nothing came for `REST_AFTER`: the connection rests without this turn's buffers, until `closes_at`.
    Rest { closes_at: Instant },
}

pin_project_lite::pin_project! {
    /// The requests of one connection answered here, one at a time, for as long as they are plain.
    pub(super) struct DirectTurn<F, B> {
        // Bytes read and not yet parsed: a head's start, or the next request a client sent early.
        read: BytesMut,
        // What waits to be written: an answer's head, and the small pieces of its body after it.
        out: Vec<u8>,
        // How much of `out` is written.
        written: usize,
        // A large body piece being written from its own bytes, after `out`.
        piece: Bytes,
        // The map of the last answer written: the next request's fields go into its allocation.
        room: HeaderMap,
        // The last answer's head lines, emptied: the next answer's are written into its allocation.
        lines: Vec<u8>,
        // When the wait for the current head began (`None` until a read found nothing).
        idle_since: Option<Instant>,
        // When the current head's first bytes came, if it is incomplete.
        head_since: Option<Instant>,
        // The one timer: it wakes the turn at or before its next deadline, and is moved only when it would wake too
        // late (deadlines move later nearly always, so a request costs it nothing).
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
        keepalive_timeout: Duration,
        header_read_timeout: Duration,
        #[pin]
        phase: Phase<F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = PhaseProjection]
    enum Phase<F, B> {
        // Waiting for a request head.
        Head,
        // The handler works on a request.
        Handling { #[pin] future: F },
        // The answer's body goes out as it comes; `close` once it is done.
        Answering { body: B, framing: Framing, owed: Owed, close: bool },
        // The last answer is written: `out` goes out, then the connection closes.
        Closing,
    }
}

impl<F, B> DirectTurn<F, B>
where
    F: Future<Output = Result<(Response<B>, Vec<u8>), Infallible>>,
    B: Body<Data = Bytes> + Unpin,
{
    /// A turn starting with `read` (bytes a hyper connection read and did not parse, or none).
    pub(super) fn new(
        read: Bytes,
        keepalive_timeout: Duration,
        header_read_timeout: Duration,
    ) -> Self {
        Self {
            read: BytesMut::from(&read[..]),
            out: Vec::new(),
            written: 0,
            piece: Bytes::new(),
            room: HeaderMap::new(),
            lines: Vec::new(),
            idle_since: None,
            head_since: None,
            sleep: None,
            keepalive_timeout,
            header_read_timeout,
            phase: Phase::Head,
        }
    }

    /// Serves requests from `stream` with `service` until the turn ends. `draining`: shutdown has begun, so the
    /// answer in progress closes the connection and a wait for a head ends at once.
    pub(super) fn poll_turn<S, D>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        stream: &mut S,
        service: &mut D,
        max_header_bytes: usize,
        draining: bool,
    ) -> Poll<io::Result<Ended>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
        D: Answer<Body = B, Future = F>,
    {
        loop {
            let mut this = self.as_mut().project();
            match this.phase.as_mut().project() {
                PhaseProjection::Head => {
                    if !this.read.is_empty() {
                        match parse_request(this.read, max_header_bytes, this.room) {
                            Parsed::Plain(request) => {
                                *this.idle_since = None;
                                *this.head_since = None;
                                let lines = std::mem::take(this.lines);
                                this.phase.set(Phase::Handling {
                                    future: service.answer(request, lines),
                                });
                                continue;
                            }
                            Parsed::Other => {
                                return Poll::Ready(Ok(Ended::HandOff(this.read.split().freeze())));
                            }
                            Parsed::Partial => {}
                        }
                    } else if draining {
                        return Poll::Ready(Ok(Ended::Closed));
                    }
                    match fill(this.read, stream, cx) {
                        Poll::Ready(Ok(0)) => return Poll::Ready(Ok(Ended::Closed)),
                        Poll::Ready(Ok(_)) => continue,
                        Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                        Poll::Pending => {}
                    }
                    // Nothing more to read: the clocks start here, not at every read (a head that comes whole in
                    // one read, nearly every one, never reads them). A head's clock runs from the first wait with
                    // part of it read.
                    let now = Instant::now();
                    let idle_since = *this.idle_since.get_or_insert(now);
                    let (deadline, rest_at) = if this.read.is_empty() {
                        (
                            idle_since + *this.keepalive_timeout,
                            Some(idle_since + REST_AFTER),
                        )
                    } else {
                        let head_since = *this.head_since.get_or_insert(now);
                        (head_since + *this.header_read_timeout, None)
                    };
                    let wake = rest_at.map_or(deadline, |rest| rest.min(deadline));
                    let sleep = this
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake.into())));
                    if sleep.deadline() > wake.into() {
                        sleep.as_mut().reset(wake.into());
                    }
                    loop {
                        if sleep.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        let now = Instant::now();
                        if now >= deadline {
                            return Poll::Ready(Ok(Ended::Closed));
                        }
                        if rest_at.is_some_and(|rest| now >= rest) {
                            return Poll::Ready(Ok(Ended::Rest {
                                closes_at: deadline,
                            }));
                        }
                        sleep.as_mut().reset(wake.into());
                    }
                }
                PhaseProjection::Handling { future } => {
                    let (response, lines) = match future.poll(cx) {
                        Poll::Ready(Ok(answered)) => answered,
                        Poll::Ready(Err(never)) => match never {},
                        Poll::Pending => {
                            // A client that leaves while its answer is made cancels it, as with hyper.
                            if client_left(this.read, stream, cx, max_header_bytes)? {
                                return Poll::Ready(Ok(Ended::Closed));
                            }
                            return Poll::Pending;
                        }
                    };
                    this.out.clear();
                    *this.written = 0;
                    let written = write_head(&response, &lines, draining, this.out);
                    // Kept, emptied, for the next answer's lines.
                    *this.lines = lines;
                    this.lines.clear();
                    let Ok((framing, close)) = written else {
                        this.out.clear();
                        this.out.extend_from_slice(
                            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        );
                        this.phase.set(Phase::Closing);
                        continue;
                    };
                    let (mut parts, body) = response.into_parts();
                    // The answer's map, emptied, holds the next request's fields.
                    parts.headers.clear();
                    *this.room = parts.headers;
                    this.phase.set(Phase::Answering {
                        body,
                        framing,
                        owed: Owed::default(),
                        close,
                    });
                }
                PhaseProjection::Answering {
                    body,
                    framing,
                    owed,
                    close,
                } => {
                    let close = *close;
                    match answer(body, framing, this.out, this.piece, owed, cx) {
                        Ok(Some(done)) => {
                            if !done {
                                // The body waits: what is ready goes out first.
                                ready!(flush(this.out, this.written, this.piece, stream, cx))?;
                                if client_left(this.read, stream, cx, max_header_bytes)? {
                                    return Poll::Ready(Ok(Ended::Closed));
                                }
                                return Poll::Pending;
                            }
                            if close {
                                this.phase.set(Phase::Closing);
                            } else {
                                ready!(flush(this.out, this.written, this.piece, stream, cx))?;
                                this.phase.set(Phase::Head);
                            }
                        }
                        Ok(None) => {
                            // Pieces ready to write: out they go, then the body is asked again.
                            ready!(flush(this.out, this.written, this.piece, stream, cx))?;
                        }
                        // The body failed or broke its own length: the client cannot be told, the connection ends.
                        Err(()) => return Poll::Ready(Ok(Ended::Closed)),
                    }
                }
                PhaseProjection::Closing => {
                    ready!(flush(this.out, this.written, this.piece, stream, cx))?;
                    ready!(Pin::new(&mut *stream).poll_shutdown(cx))?;
                    return Poll::Ready(Ok(Ended::Closed));
                }
            }
        }
    }
}

/// Moves what the body has ready into `out` (or `piece`, for a large piece) in the framing's form. `Some(true)`:
/// the body is done and its end written; `Some(false)`: it has nothing more ready; `None`: pieces wait to be
/// written before more is taken. `Err`: the body failed, or gave more or fewer bytes than its length said.
fn answer<B: Body<Data = Bytes> + Unpin>(
    body: &mut B,
    framing: &mut Framing,
    out: &mut Vec<u8>,
    piece: &mut Bytes,
    owed: &mut Owed,
    cx: &mut Context<'_>,
) -> Result<Option<bool>, ()> {
    if *framing == Framing::Nothing {
        return Ok(Some(true));
    }
    loop {
        if !piece.is_empty() || out.len() >= COPY_LIMIT {
            return Ok(None);
        }
        // What goes after a large piece, once it is written: its chunk's end, then the body's end if it came.
        if std::mem::take(&mut owed.chunk_end) {
            out.extend_from_slice(b"\r\n");
        }
        if owed.body_end {
            return finish(framing, out);
        }
        let frame = match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Pending => return Ok(Some(false)),
            Poll::Ready(None) => return finish(framing, out),
            Poll::Ready(Some(Err(_))) => return Err(()),
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        match framing.stage(frame, out, COPY_LIMIT).map_err(|_| ())? {
            Staged::Gathered => {}
            Staged::Ended => return Ok(Some(true)),
            // Written from its own bytes after `out`; what follows it waits until it is written.
            Staged::Piece { data, chunk_end } => {
                *piece = data;
                owed.chunk_end = chunk_end;
            }
        }
        // As hyper does: a body that says it is done is not asked again (a proxied answer's connection goes back
        // to its pool as its last bytes are read).
        if body.is_end_stream() {
            if piece.is_empty() {
                return finish(framing, out);
            }
            owed.body_end = true;
        }
    }
}

/// What an answer's body still owes the wire after the large piece being written.
#[derive(Debug, Default, Clone, Copy)]
struct Owed {
    /// The end of that piece's chunk (CRLF).
    chunk_end: bool,
    /// The end of the body: the body said it was done with that piece.
    body_end: bool,
}

/// Ends a body that is done (see [`Framing::finish`]), as [`answer`] reports it.
fn finish(framing: &mut Framing, out: &mut Vec<u8>) -> Result<Option<bool>, ()> {
    framing.finish(out).map(|()| Some(true)).map_err(|_| ())
}

/// Writes `out` from `written` on, then `piece`; ready once both are written (and `out` emptied).
fn flush<S: AsyncWrite + Unpin>(
    out: &mut Vec<u8>,
    written: &mut usize,
    piece: &mut Bytes,
    stream: &mut S,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while *written < out.len() {
        let wrote = if piece.is_empty() {
            ready!(Pin::new(&mut *stream).poll_write(cx, &out[*written..]))?
        } else {
            let slices = [io::IoSlice::new(&out[*written..]), io::IoSlice::new(piece)];
            let wrote = ready!(Pin::new(&mut *stream).poll_write_vectored(cx, &slices))?;
            let of_out = wrote.min(out.len() - *written);
            piece.advance(wrote - of_out);
            of_out
        };
        if wrote == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *written += wrote;
    }
    out.clear();
    *written = 0;
    while !piece.is_empty() {
        let wrote = ready!(Pin::new(&mut *stream).poll_write(cx, piece))?;
        if wrote == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        piece.advance(wrote);
    }
    Poll::Ready(Ok(()))
}

/// Reads what is there into `read`: the number of bytes read, 0 at the end of the stream. The buffer is grown only
/// when little room is left in it: the heads of many requests share one allocation.
fn fill<S: AsyncRead + Unpin>(
    read: &mut BytesMut,
    stream: &mut S,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if read.capacity() - read.len() < READ_CHUNK / 8 {
        read.reserve(READ_CHUNK);
    }
    tokio_util::io::poll_read_buf(Pin::new(stream), cx, read)
}

/// Whether the client has closed its side while its answer is made or waits for its body. What it sent meanwhile
/// (the start of its next request) is kept in `read`, up to a head's limit.
fn client_left<S: AsyncRead + Unpin>(
    read: &mut BytesMut,
    stream: &mut S,
    cx: &mut Context<'_>,
    max_header_bytes: usize,
) -> io::Result<bool> {
    while read.len() <= max_header_bytes {
        match fill(read, stream, cx) {
            Poll::Ready(Ok(0)) => return Ok(true),
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(error)) => return Err(error),
            Poll::Pending => return Ok(false),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Empty, Full, StreamBody};

    fn parse(text: &str) -> (Parsed, BytesMut) {
        let mut read = BytesMut::from(text.as_bytes());
        let parsed = parse_request(&mut read, 1024, &mut HeaderMap::new());
        (parsed, read)
    }

    #[test]
    fn a_plain_request_is_taken_from_the_buffer_with_its_fields() {
        let (parsed, rest) =
            parse("GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Api-Key: k\r\nconnection: Keep-Alive\r\n\r\nGET /next");
        let Parsed::Plain(request) = parsed else {
            panic!("not plain: {parsed:?}");
        };
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri(), "/a?b=1");
        assert_eq!(request.version(), Version::HTTP_11);
        assert_eq!(request.headers()["host"], "x");
        assert_eq!(request.headers()["x-api-key"], "k");
        assert_eq!(request.headers().len(), 3);
        assert_eq!(&rest[..], b"GET /next", "the next request's bytes stay");
    }

    #[test]
    fn anything_but_a_plain_request_is_left_whole_for_hyper() {
        for text in [
            // A body not read whole yet, or framed in a way hyper reads or refuses by its own rules.
            "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
            "POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
            "POST / HTTP/1.1\r\nContent-Length: +2\r\n\r\nab",
            "POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\nab",
            "POST / HTTP/1.1\r\nContent-Length: 1234567890123\r\n\r\nab",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
            "HEAD / HTTP/1.1\r\n\r\n",
            "CONNECT x:443 HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET /a b HTTP/1.1\r\n\r\n",
        ] {
            let (parsed, rest) = parse(text);
            assert!(matches!(parsed, Parsed::Other), "{text:?}: {parsed:?}");
            assert_eq!(&rest[..], text.as_bytes(), "{text:?}: the bytes stay whole");
        }
        // An empty body is no body.
        let (parsed, _) = parse("DELETE /x HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
        assert!(matches!(parsed, Parsed::Plain(_)), "{parsed:?}");
    }

    #[test]
    fn a_body_read_whole_with_its_head_goes_with_the_request() {
        let (parsed, rest) =
            parse("POST /chat HTTP/1.1\r\nContent-Length: 7\r\n\r\n{\"a\":1}GET /next HTTP/1.1");
        let Parsed::Plain(request) = parsed else {
            panic!("not plain: {parsed:?}");
        };
        assert_eq!(request.method(), Method::POST);
        assert_eq!(&request.body()[..], b"{\"a\":1}");
        assert_eq!(request.headers()["content-length"], "7");
        assert_eq!(&rest[..], b"GET /next HTTP/1.1", "the next request stays");
    }

    #[test]
    fn a_head_over_the_limit_is_hyper_s_to_refuse() {
        // Whole in the buffer, but over the limit of 1,024 bytes: hyper answers it (431) as it does those it reads.
        let long = format!("GET / HTTP/1.1\r\nX-Long: {}\r\n\r\n", "a".repeat(1100));
        let (parsed, rest) = parse(&long);
        assert!(matches!(parsed, Parsed::Other), "{parsed:?}");
        assert_eq!(rest.len(), long.len());
    }

    #[test]
    fn a_head_still_incomplete_past_the_limit_is_hyper_s_to_refuse() {
        let (parsed, _) = parse("GET / HTTP/1.1\r\nHost: x\r\n");
        assert!(matches!(parsed, Parsed::Partial));
        let long = format!("GET / HTTP/1.1\r\nX-Long: {}\r\n", "a".repeat(2000));
        let (parsed, rest) = parse(&long);
        assert!(matches!(parsed, Parsed::Other));
        assert_eq!(rest.len(), long.len());
    }

    fn head<B: Body>(response: &Response<B>, close: bool) -> (String, Framing, bool) {
        let mut out = Vec::new();
        let (framing, close) = write_head(response, b"", close, &mut out).expect("written");
        (String::from_utf8(out).expect("text"), framing, close)
    }

    #[test]
    fn an_answer_s_head_frames_its_body_as_hyper_does() {
        // A body of known size gets its length, and a Date.
        let mut response = Response::new(Full::new(Bytes::from_static(b"hello")));
        response
            .headers_mut()
            .insert("x-request-id", HeaderValue::from_static("9"));
        let mut out = Vec::new();
        let (framing, close) =
            write_head(&response, b"x-ratelimit-remaining: 9\r\n", false, &mut out)
                .expect("written");
        let text = String::from_utf8(out).expect("text");
        assert!(
            text.starts_with(
                "HTTP/1.1 200 OK\r\nx-request-id: 9\r\nx-ratelimit-remaining: 9\r\ncontent-length: 5\r\ndate: "
            ),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");
        assert_eq!((framing, close), (Framing::Length(5), false));

        // A length the fields give is kept, not doubled; the answer's own Date stands.
        let mut response = Response::new(Full::new(Bytes::from_static(b"hello")));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        response
            .headers_mut()
            .insert(header::DATE, HeaderValue::from_static("then"));
        let (text, framing, _) = head(&response, false);
        assert_eq!(
            text,
            "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 5\r\ndate: then\r\n\r\n"
        );
        assert_eq!(framing, Framing::Length(5));

        // A body of unknown size is chunked; a closing connection says so.
        let stream = futures_util::stream::iter([Ok::<_, Infallible>(http_body::Frame::data(
            Bytes::from_static(b"x"),
        ))]);
        let response = Response::new(StreamBody::new(stream));
        let (text, framing, close) = head(&response, true);
        assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
        assert!(text.contains("connection: close\r\n"), "{text}");
        assert_eq!((framing, close), (Framing::Chunked, true));

        // No body: a length of 0; 204 and 304 have none at all.
        let (text, framing, _) = head(&Response::new(Empty::<Bytes>::new()), false);
        assert!(text.contains("content-length: 0\r\n"), "{text}");
        assert_eq!(framing, Framing::Nothing);
        let mut response = Response::new(Empty::<Bytes>::new());
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        let (text, framing, _) = head(&response, false);
        assert!(
            text.starts_with("HTTP/1.1 304 Not Modified\r\ndate: "),
            "{text}"
        );
        assert_eq!(framing, Framing::Nothing);

        // An answer of HTTP/1.0 without keep-alive closes the connection.
        let mut response = Response::new(Full::new(Bytes::from_static(b"x")));
        *response.version_mut() = Version::HTTP_10;
        let (text, _, close) = head(&response, false);
        assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
        assert!(close);

        // Transfer-Encoding and Content-Length together cannot both frame it.
        let mut response = Response::new(Full::new(Bytes::from_static(b"x")));
        response.headers_mut().insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1"));
        assert!(write_head(&response, b"", false, &mut Vec::new()).is_err());
    }

    /// Runs `answer` over `body` to its end as the turn does, writing `out` then the large piece after each call
    /// that has something to write: the bytes the client would read.
    fn answered<B: Body<Data = Bytes> + Unpin>(framing: Framing, mut body: B) -> Vec<u8> {
        let (mut framing, mut out, mut piece, mut owed) =
            (framing, Vec::new(), Bytes::new(), Owed::default());
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let mut wire = Vec::new();
        loop {
            let step = answer(
                &mut body,
                &mut framing,
                &mut out,
                &mut piece,
                &mut owed,
                &mut cx,
            );
            wire.append(&mut out);
            wire.extend_from_slice(&std::mem::take(&mut piece));
            match step {
                Ok(Some(true)) => return wire,
                Ok(None) => {}
                other => panic!("the body cannot wait here: {other:?}"),
            }
        }
    }

    /// A body of `pieces` that learns it has ended only when asked for one more (a stream's).
    fn streamed(pieces: &[Vec<u8>]) -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
        let frames: Vec<Result<http_body::Frame<Bytes>, Infallible>> = pieces
            .iter()
            .map(|piece| Ok(http_body::Frame::data(Bytes::from(piece.clone()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    /// `pieces` as chunks, then the last chunk.
    fn chunks(pieces: &[Vec<u8>]) -> Vec<u8> {
        let mut wire = Vec::new();
        for piece in pieces {
            wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            wire.extend_from_slice(piece);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        wire
    }

    #[test]
    fn a_large_piece_keeps_its_place_among_the_chunks_and_before_the_last() {
        let large = vec![b'x'; COPY_LIMIT + 1];
        for pieces in [
            vec![b"ab".to_vec(), large.clone(), b"cd".to_vec()],
            vec![b"ab".to_vec(), large.clone()],
            vec![large.clone()],
        ] {
            assert_eq!(
                answered(Framing::Chunked, streamed(&pieces)),
                chunks(&pieces)
            );
            let length = pieces.iter().map(Vec::len).sum::<usize>() as u64;
            assert_eq!(
                answered(Framing::Length(length), streamed(&pieces)),
                pieces.concat()
            );
        }
        // A body that says it is done with its large last piece: the end still comes after the piece.
        let whole = Full::new(Bytes::from(large.clone()));
        assert_eq!(
            answered(Framing::Chunked, whole),
            chunks(std::slice::from_ref(&large))
        );
        let whole = Full::new(Bytes::from(large.clone()));
        assert_eq!(answered(Framing::Length(large.len() as u64), whole), large);
    }
}
