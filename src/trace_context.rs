//! W3C trace context: the `traceparent` a request brings (its trace, the caller's span, whether it is sampled) and
//! the one tollgate sends upstream in its place.

use http::{HeaderMap, HeaderValue};

/// The `traceparent` field's name.
pub const TRACEPARENT: &str = "traceparent";

/// A trace context: a trace, one span in it, and whether the trace is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace's id (never all zeros).
    pub trace_id: [u8; 16],
    /// The span's id (never all zeros).
    pub span_id: [u8; 8],
    /// Whether the trace is recorded (flag `01`).
    pub sampled: bool,
}

// === impl TraceContext ===

impl TraceContext {
    /// The context of a well-formed `traceparent` in `headers` (`00-<trace id>-<parent id>-<flags>`; a later
    /// version's extra fields are ignored, as the recommendation asks), if any.
    pub fn of(headers: &HeaderMap) -> Option<Self> {
        let value = headers.get(TRACEPARENT)?.as_bytes();
        let mut fields = value.split(|&byte| byte == b'-');
        let version = fields.next()?;
        let trace_id = hex::<16>(fields.next()?)?;
        let span_id = hex::<8>(fields.next()?)?;
        let flags = hex::<1>(fields.next()?)?;
        let version = hex::<1>(version)?[0];
        let well_formed = version != 0xff
            && (version != 0 || fields.next().is_none())
            && trace_id != [0; 16]
            && span_id != [0; 8];
        well_formed.then_some(Self {
            trace_id,
            span_id,
            sampled: flags[0] & 1 == 1,
        })
    }

    /// A new span in this context's trace.
    pub fn child(&self) -> Self {
        Self {
            span_id: new_span_id(),
            ..*self
        }
    }

    /// A new trace, sampled or not.
    pub fn new_trace(sampled: bool) -> Self {
        let mut trace_id = [0; 16];
        while trace_id == [0; 16] {
            trace_id = fastrand::u128(..).to_be_bytes();
        }
        Self {
            trace_id,
            span_id: new_span_id(),
            sampled,
        }
    }

    /// The `traceparent` that names this span as the parent.
    pub fn traceparent(&self) -> HeaderValue {
        let mut text = [0u8; 55];
        text[..3].copy_from_slice(b"00-");
        write_hex(&mut text[3..35], &self.trace_id);
        text[35] = b'-';
        write_hex(&mut text[36..52], &self.span_id);
        text[52..].copy_from_slice(if self.sampled { b"-01" } else { b"-00" });
        // Only ASCII hex digits and dashes were written.
        HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The trace id as 32 lower-case hex digits (ASCII).
    pub fn trace_id_hex(&self) -> [u8; 32] {
        let mut text = [0u8; 32];
        write_hex(&mut text, &self.trace_id);
        text
    }
}

fn new_span_id() -> [u8; 8] {
    let mut id = [0; 8];
    while id == [0; 8] {
        id = fastrand::u64(..).to_be_bytes();
    }
    id
}

/// `N` bytes from exactly `2 N` lower-case hex digits.
fn hex<const N: usize>(field: &[u8]) -> Option<[u8; N]> {
    if field.len() != 2 * N {
        return None;
    }
    let digit = |byte: u8| match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0; N];
    for (i, pair) in field.chunks_exact(2).enumerate() {
        bytes[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(bytes)
}

fn write_hex(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(byte >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(byte & 0xf)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(traceparent: &str) -> Option<TraceContext> {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_str(traceparent).unwrap());
        TraceContext::of(&headers)
    }

    #[test]
    fn a_well_formed_traceparent_is_read_and_written_back_the_same() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parsed(text).expect("well formed");
        assert!(context.sampled);
        assert_eq!(&context.trace_id_hex(), b"4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.traceparent(), text);
        assert!(
            !parsed("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .expect("not sampled")
                .sampled
        );
        // A later version may carry more fields.
        assert!(parsed("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").is_some());
    }

    #[test]
    fn a_malformed_traceparent_is_none() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(parsed(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_child_keeps_the_trace_and_takes_a_new_span() {
        let trace = TraceContext::new_trace(true);
        let child = trace.child();
        assert_eq!(child.trace_id, trace.trace_id);
        assert_ne!(child.span_id, trace.span_id);
        assert!(
            TraceContext::of(&{
                let mut headers = HeaderMap::new();
                headers.insert(TRACEPARENT, child.traceparent());
                headers
            }) == Some(child)
        );
    }
}
