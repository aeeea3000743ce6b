//! The OTLP messages tollgate sends (opentelemetry/proto/collector/trace/v1 and what it names), as prost structs:
//! the handful of fields a span of ours fills, numbered as the protocol numbers them. The test suite decodes what
//! the gateway sends with the OpenTelemetry project's own generated types.

/// `ExportTraceServiceRequest`: what one POST to `/v1/traces` carries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ExportTraceServiceResponse`: its fields (a partial success) are not read; a gRPC status says whether it
/// arrived.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceResponse {}

/// `ResourceSpans`: the spans of one resource (this gateway).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

/// `Resource`: what made the spans (`service.name`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `ScopeSpans`: the spans of one instrumentation scope (tollgate's own).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

/// `InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

/// `Span.SpanKind`.
pub mod span_kind {
    /// A span of work inside the gateway (the limiter call).
    pub const INTERNAL: i32 = 1;
    /// The request the gateway served.
    pub const SERVER: i32 = 2;
    /// The request it sent upstream.
    pub const CLIENT: i32 = 3;
}

/// `Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub code: i32,
}

/// `Status.StatusCode.STATUS_CODE_ERROR`.
pub const STATUS_ERROR: i32 = 2;

/// `KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `AnyValue`, of the kinds a span of ours carries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3")]
    pub value: Option<Value>,
}

/// `AnyValue.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
}

// === impl KeyValue ===

impl KeyValue {
    /// A string attribute.
    pub fn text(key: &str, value: impl Into<String>) -> Self {
        Self::of(key, Value::String(value.into()))
    }

    /// An integer attribute.
    pub fn int(key: &str, value: i64) -> Self {
        Self::of(key, Value::Int(value))
    }

    /// A boolean attribute.
    pub fn flag(key: &str, value: bool) -> Self {
        Self::of(key, Value::Bool(value))
    }

    fn of(key: &str, value: Value) -> Self {
        Self {
            key: key.to_owned(),
            value: Some(AnyValue { value: Some(value) }),
        }
    }
}
