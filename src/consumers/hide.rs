//! `hide_credentials`: the credential that named the caller is removed from the request sent upstream.

use http::uri::PathAndQuery;
use http::{Request, Uri};

use super::settings::CredentialSource;
use crate::key::names_parameter;

/// Removes the credential at `source` from `request`: the header (every line of it), or the query parameter under
/// every spelling that names it, the rest of the query kept byte for byte (no `?` left when nothing remains).
pub fn hide<B>(source: &CredentialSource, request: &mut Request<B>) {
    match source {
        CredentialSource::Header(name) => {
            request.headers_mut().remove(name);
        }
        CredentialSource::Query(name) => {
            if let Some(uri) = without_parameter(request.uri(), name) {
                *request.uri_mut() = uri;
            }
        }
    }
}

/// `uri` without the query parameter `name`; `None` when it has no such parameter.
fn without_parameter(uri: &Uri, name: &str) -> Option<Uri> {
    let query = uri.query()?;
    let kept = query_without(query, name)?;
    let path = uri.path();
    let path_and_query = if kept.is_empty() {
        PathAndQuery::try_from(path)
    } else {
        PathAndQuery::try_from(format!("{path}?{kept}"))
    };
    let mut parts = uri.clone().into_parts();
    // Parts of a URI that parsed, less some of its characters: they parse again.
    parts.path_and_query = Some(path_and_query.ok()?);
    Uri::from_parts(parts).ok()
}

/// `query` without the parameter `name`: each pair that names it goes with the separator after it (or, the last
/// pair, the one before it); `None` when no pair names it.
fn query_without(query: &str, name: &str) -> Option<String> {
    let mut kept = query.to_owned();
    let mut removed = false;
    while let Some((start, end)) = pair_naming(&kept, name) {
        let range = if end < kept.len() {
            start..end + 1
        } else {
            start.saturating_sub(1)..end
        };
        kept.replace_range(range, "");
        removed = true;
    }
    removed.then_some(kept)
}

/// The byte range of the first pair of `query` that names the parameter `name`.
fn pair_naming(query: &str, name: &str) -> Option<(usize, usize)> {
    let mut start = 0;
    for pair in query.split(['&', ';']) {
        let end = start + pair.len();
        if names_parameter(pair, name) {
            return Some((start, end));
        }
        start = end + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_goes_and_the_rest_of_the_query_stays_as_written() {
        for (query, kept) in [
            ("api_key=k", None),
            ("a=1&api_key=k&b=%41+c;d", Some("a=1&b=%41+c;d")),
            ("a=1&api_key=k", Some("a=1")),
            ("API%5Fkey[]=k;z=1", Some("z=1")),
            ("&&api_key=k&b", Some("&&b")),
            ("api_keys=k&x=api_key", Some("api_keys=k&x=api_key")),
        ] {
            let uri: Uri = format!("/p/a?{query}").parse().expect("uri");
            let sent = without_parameter(&uri, "api_key").unwrap_or(uri.clone());
            assert_eq!(sent.query(), kept, "{query}");
            assert_eq!(sent.path(), "/p/a");
        }
        let absolute: Uri = "http://h.test/p?x=1&api_key=k".parse().expect("uri");
        let sent = without_parameter(&absolute, "api_key").expect("removed");
        assert_eq!(sent.to_string(), "http://h.test/p?x=1");
    }
}
