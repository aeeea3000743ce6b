//! WebSocket upgrades: which requests are one, the fields they keep, and the tunnel spliced once both sides switch.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::tunnel::TunnelOpen;

/// The `Upgrade` value of a WebSocket opening handshake (RFC 6455 §4.1: an HTTP/1.1 `GET` whose `Connection` names
/// `upgrade` and whose `Upgrade` names `websocket`), or `None` for any other request, whose `Upgrade` is dropped
/// with the other hop-by-hop fields. HTTP/2 has no `Upgrade`; its WebSocket (RFC 8441) is not proxied.
pub(super) fn websocket_upgrade<B>(request: &Request<B>) -> Option<HeaderValue> {
    // hyper's HTTP/1.1 server gives a request an `OnUpgrade` only when it has an `Upgrade` field: without one, this
    // is the whole cost, with no field looked up (most requests carry no extension at all).
    if request.extensions().get::<OnUpgrade>().is_none()
        || request.version() != Version::HTTP_11
        || request.method() != Method::GET
    {
        return None;
    }
    let headers = request.headers();
    if !any_token(headers, &header::CONNECTION, |token| {
        token.eq_ignore_ascii_case("upgrade")
    }) {
        return None;
    }
    // A protocol may carry a version (`websocket/13`); only its name counts.
    let names_websocket = any_token(headers, &header::UPGRADE, |token| {
        let name = token.split_once('/').map_or(token, |(name, _)| name);
        name.trim().eq_ignore_ascii_case("websocket")
    });
    names_websocket
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Puts back the two fields a switch of protocols needs, which the hop-by-hop rule removed with the rest.
pub(super) fn keep_upgrade_fields(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, protocol);
}

/// What a WebSocket tunnel holds for as long as it is open. The server puts one in each handshake request it
/// serves, so that its drain waits for the tunnel, which outlives the HTTP connection it came from, as it waits for
/// a connection: within the grace period, then the tunnel is cut.
#[derive(Debug, Clone)]
pub(crate) struct TunnelHold {
    /// Counted by the server's drain for as long as it lives; never read.
    _held: tokio::sync::watch::Receiver<()>,
}

impl TunnelHold {
    pub(crate) fn new(held: tokio::sync::watch::Receiver<()>) -> Self {
        Self { _held: held }
    }
}

/// Copies bytes both ways between the client's and the upstream's upgraded connections until either side closes.
/// Spawned as its own task: the handshake's response is already on its way back when the two sides switch. `hold`
/// (the drain's, and the one admission waits on) is dropped with the tunnel.
pub(super) async fn splice(
    client: OnUpgrade,
    upstream: OnUpgrade,
    upstream_name: String,
    hold: (Option<TunnelHold>, TunnelOpen),
) {
    let _hold = hold;
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(error) => {
            tracing::debug!(upstream = %upstream_name, %error, "WebSocket upgrade did not complete");
            return;
        }
    };
    let _open = OpenTunnel::count(&upstream_name);
    let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((to_upstream, to_client)) => tracing::debug!(
            upstream = %upstream_name,
            to_upstream,
            to_client,
            "WebSocket tunnel closed"
        ),
        Err(error) => {
            tracing::debug!(upstream = %upstream_name, %error, "WebSocket tunnel broken");
        }
    }
}

/// One open tunnel in `tollgate_websocket_tunnels`, for as long as it lives (also when its task is aborted).
struct OpenTunnel(metrics::Gauge);

impl OpenTunnel {
    fn count(upstream: &str) -> Self {
        let gauge =
            metrics::gauge!("tollgate_websocket_tunnels", "upstream" => upstream.to_owned());
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Whether a token of any `name` field (comma-separated lists, whitespace around tokens) satisfies `matches`.
fn any_token(
    headers: &HeaderMap,
    name: &header::HeaderName,
    matches: impl Fn(&str) -> bool,
) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| matches(token.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as hyper's HTTP/1.1 server hands it over: with an `OnUpgrade` when it has an `Upgrade` field.
    fn request(method: &str, version: Version, fields: &[(&str, &str)]) -> Request<()> {
        let mut request = bare_request(method, version, fields);
        if request.headers().contains_key(header::UPGRADE) {
            // Outside hyper an `OnUpgrade` can only be taken from a message without one; its presence is the mark.
            let mark = hyper::upgrade::on(Request::new(()));
            request.extensions_mut().insert(mark);
        }
        request
    }

    /// A request without the `OnUpgrade` hyper would add, as from an HTTP/2 connection or a hand-built request.
    fn bare_request(method: &str, version: Version, fields: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder()
            .method(method)
            .uri("/ws")
            .version(version);
        for (name, value) in fields {
            builder = builder.header(*name, *value);
        }
        builder.body(()).expect("request")
    }

    #[test]
    fn without_hyper_s_upgrade_mark_nothing_is_an_upgrade() {
        let fields = [("connection", "upgrade"), ("upgrade", "websocket")];
        assert!(websocket_upgrade(&request("GET", Version::HTTP_11, &fields)).is_some());
        assert_eq!(
            websocket_upgrade(&bare_request("GET", Version::HTTP_11, &fields)),
            None
        );
    }

    #[test]
    fn a_websocket_handshake_is_recognised_whatever_the_case_and_lists() {
        for (connection, upgrade) in [
            ("Upgrade", "websocket"),
            ("keep-alive, Upgrade", "WebSocket"),
            ("upgrade", "foo/2, websocket/13"),
        ] {
            let r = request(
                "GET",
                Version::HTTP_11,
                &[("connection", connection), ("upgrade", upgrade)],
            );
            assert_eq!(
                websocket_upgrade(&r).as_ref().map(HeaderValue::as_bytes),
                Some(upgrade.as_bytes()),
                "{connection} / {upgrade}"
            );
        }
    }

    /// A request line's method and version, and its fields.
    type Case = (
        &'static str,
        Version,
        &'static [(&'static str, &'static str)],
    );

    #[test]
    fn other_upgrades_and_incomplete_handshakes_are_not_websocket() {
        let cases: [Case; 6] = [
            (
                "GET",
                Version::HTTP_11,
                &[("connection", "upgrade"), ("upgrade", "h2c")],
            ),
            ("GET", Version::HTTP_11, &[("upgrade", "websocket")]),
            (
                "GET",
                Version::HTTP_11,
                &[("connection", "keep-alive"), ("upgrade", "websocket")],
            ),
            ("GET", Version::HTTP_11, &[("connection", "upgrade")]),
            (
                "POST",
                Version::HTTP_11,
                &[("connection", "upgrade"), ("upgrade", "websocket")],
            ),
            (
                "GET",
                Version::HTTP_10,
                &[("connection", "upgrade"), ("upgrade", "websocket")],
            ),
        ];
        for (method, version, fields) in cases {
            let r = request(method, version, fields);
            assert_eq!(
                websocket_upgrade(&r),
                None,
                "{method} {version:?} {fields:?}"
            );
        }
    }
}
