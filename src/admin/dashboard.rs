//! `GET /dashboard`: one self-contained page (no CDN, font or script from elsewhere: the gateway may have no
//! internet) that asks for the admin token when one is set and shows `/stats` live, every second.

use axum::http::header;
use axum::response::IntoResponse;

/// The page; it holds no data of its own (what it shows comes from `/stats`, behind the token), so it is open.
pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing but this listener: no script, style or connection elsewhere.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
        ],
        include_str!("dashboard.html"),
    )
}
