//! The work admission keeps for after the answer runs once on every ending of an answer the layer gives: its body's
//! end, its drop, its failure, the inner service's error, and the request's own drop; never for a refusal.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use tower::{Layer, Service, ServiceExt};

use super::RateLimitLayer;
use crate::admission::recording::Endings;
use crate::admission::Ending;
use crate::limiter::Algorithm;

type Answer = Response<BoxBody<Bytes, std::io::Error>>;

/// An inner service answering by path: `/whole` a whole body, `/stream` one frame then nothing, `/broken` one frame
/// then an error, `/error` an error instead of a response, `/never` never.
async fn inner(request: Request<()>) -> Result<Answer, std::io::Error> {
    let part = || Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"part")));
    let body = match request.uri().path() {
        "/whole" => Full::new(Bytes::from_static(b"whole"))
            .map_err(|never: Infallible| match never {})
            .boxed(),
        "/stream" => {
            let frames =
                futures_util::stream::iter([part()]).chain(futures_util::stream::pending());
            BodyExt::boxed(StreamBody::new(frames))
        }
        "/broken" => {
            let frames = futures_util::stream::iter([part(), Err(std::io::Error::other("reset"))]);
            BodyExt::boxed(StreamBody::new(frames))
        }
        "/error" => return Err(std::io::Error::other("inner failed")),
        _ => std::future::pending().await,
    };
    Ok(Response::new(body))
}

/// A layer with one limit of `limit` requests a minute, recording how each admitted answer ends into `endings`.
fn layer(limit: u64, endings: &Endings) -> RateLimitLayer {
    let built = RateLimitLayer::builder()
        .memory_store()
        .scope("seam")
        .limit_by(
            "per-ip",
            ["ip"],
            Algorithm::FixedWindow {
                limit,
                period_ms: 60_000,
            },
        )
        .build()
        .expect("layer");
    let endings = endings.clone();
    built.with_after_answer(move || endings.work())
}

fn request(path: &str) -> Request<()> {
    let mut request = Request::get(path).body(()).expect("request");
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("peer");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

#[tokio::test]
async fn the_work_kept_for_after_the_answer_runs_once_on_each_ending_in_the_layer() {
    let endings = Endings::default();
    let mut service = layer(100, &endings).layer(tower::service_fn(inner));

    let response = service
        .ready()
        .await
        .expect("ready")
        .call(request("/whole"))
        .await;
    let response = response.expect("response");
    assert!(endings.take().is_empty(), "the answer has not ended yet");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&body[..], b"whole");
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);

    let response = service.call(request("/stream")).await.expect("response");
    let mut body = response.into_body();
    body.frame().await.expect("a frame").expect("data");
    drop(body);
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Cut)]);

    let response = service.call(request("/broken")).await.expect("response");
    assert!(response.into_body().collect().await.is_err());
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Failed)]);

    assert!(service.call(request("/error")).await.is_err());
    assert_eq!(endings.take(), [(None, Ending::Failed)]);

    let never = service.call(request("/never"));
    assert!(tokio::time::timeout(Duration::from_millis(50), never)
        .await
        .is_err());
    assert_eq!(endings.take(), [(None, Ending::Cut)]);
}

#[tokio::test]
async fn a_refused_request_keeps_nothing_for_after_the_answer_in_the_layer() {
    let endings = Endings::default();
    let mut service = layer(1, &endings).layer(tower::service_fn(inner));
    let admitted = service.call(request("/whole")).await.expect("response");
    admitted.into_body().collect().await.expect("body");
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);

    let refused = service.call(request("/whole")).await.expect("response");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    refused.into_body().collect().await.expect("body");
    assert!(endings.take().is_empty(), "a refusal settles nothing");
}
