//! The HTTP client the ClickHouse sink talks through: the clickhouse crate's own (hyper, rustls
//! with the system trust store or `SSL_CERT_FILE`, TCP keep-alive, a short idle pool), with each
//! connection watched for two things the crate misses, both from a proxy or load balancer in
//! between:
//! - a `200` whose body is a ClickHouse exception without the `X-ClickHouse-Exception-Code`
//!   header or the `(version …)` ending that the crate recognises: the request fails with
//!   [`ExceptionIn200`], which [`super::clickhouse::classify`] classifies by its code like any
//!   other ClickHouse error;
//! - an error status (4xx, 5xx) or a redirect (3xx) with no `X-ClickHouse-…` header, which every
//!   ClickHouse answer carries (18.16 included): the proxy's own answer (nginx's 413 past its
//!   body limit, an auth proxy's 401, an ingress redirecting `http://` to `https://`), whose body
//!   has no ClickHouse code and whose status the crate drops. The request fails with
//!   [`ProxyAnswer`], classified by its status (a redirect: configuration, naming where to).
//!
//! The watch reads the bytes hyper reads: it notes each status line and, while the status is
//! `200`, looks for `Code: N` followed by `DB::Exception` (both formats ClickHouse has used),
//! keeping the last few bytes of each read so a split pattern is found too. Answers to INSERTs
//! are empty; the service's SELECTs read only system tables.
//!
//! An answer that comes while the request's body is still being sent (a proxy's 413 past its
//! body limit, as soon as the limit is passed) closes the body under the clickhouse crate, which
//! reports the closed channel and drops the answer: taken for a network outage, the INSERT was
//! retried whole, without end. So each INSERT carries a [`query_id`] that the watch reads in
//! what is written, and what it finds is kept by that id for the INSERT to ask ([`heard`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::Uri;
use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioExecutor;

/// A ClickHouse exception found in the body of a `200` answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("answered 200 with an exception in the body: {0}")]
pub struct ExceptionIn200(pub String);

/// An error status answered by something between the service and ClickHouse, not by ClickHouse:
/// the status and its line's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("answered {status} {reason} by a proxy in front of ClickHouse (no X-ClickHouse-… header)")]
pub struct ProxyAnswer {
    pub status: u16,
    pub reason: String,
}

/// What the watch found that fails the request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Spotted {
    Exception(ExceptionIn200),
    Proxy(ProxyAnswer),
}

impl Spotted {
    fn into_io(self) -> std::io::Error {
        match self {
            Spotted::Exception(exception) => std::io::Error::other(exception),
            Spotted::Proxy(answer) => std::io::Error::other(answer),
        }
    }
}

/// A `query_id` for one request (ClickHouse's `system.query_log` records it too): this process's
/// random prefix, which no body can know to imitate, and a count.
pub fn query_id() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", prefix(), COUNT.fetch_add(1, Ordering::Relaxed))
}

fn prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| format!("replay-ingest-{}", uuid::Uuid::new_v4().simple()))
}

/// What precedes the count of a [`query_id`] in a request's URL.
fn marker() -> &'static [u8] {
    static MARKER: OnceLock<String> = OnceLock::new();
    MARKER
        .get_or_init(|| format!("query_id={}-", prefix()))
        .as_bytes()
}

/// Answers the watch found, by the `query_id` of the request they failed, the latest last.
static HEARD: Mutex<VecDeque<(String, Spotted)>> = Mutex::new(VecDeque::new());
/// Most answers kept for their requests to ask: one per INSERT in flight is enough.
const MOST_HEARD: usize = 64;

fn record(query_id: String, spotted: Spotted) {
    let mut heard = HEARD.lock().unwrap_or_else(PoisonError::into_inner);
    if heard.len() == MOST_HEARD {
        heard.pop_front();
    }
    heard.push_back((query_id, spotted));
}

/// The answer the watch found to the request `query_id` (as the error it failed the request
/// with), if it found one. Asked once: the answer is forgotten.
pub fn heard(query_id: &str) -> Option<std::io::Error> {
    let mut heard = HEARD.lock().unwrap_or_else(PoisonError::into_inner);
    let at = heard.iter().position(|(id, _)| id == query_id)?;
    heard.remove(at).map(|(_, spotted)| spotted.into_io())
}

/// An `https://` URL with no trust roots to check the server's certificate against.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no TLS trust roots could be loaded ({0}): an https:// URL is refused rather than sent in plain text; put the CA bundle in SSL_CERT_FILE"
)]
pub struct NoTrustRoots(pub String);

/// A [`clickhouse::Client`] whose connections are watched.
pub fn clickhouse_client() -> clickhouse::Client {
    let mut http = HttpConnector::new();
    http.set_keepalive(Some(Duration::from_secs(60)));
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(rustls::crypto::aws_lc_rs::default_provider())
        .map(|builder| {
            builder
                .https_or_http()
                .enable_http1()
                .wrap_connector(http.clone())
        });
    client(match https {
        Ok(https) => Inner::Https(https),
        // No usable trust store (none in the image, an SSL_CERT_FILE that is missing or empty):
        // plain HTTP works, and an `https://` URL is refused. (`enforce_http(false)` would open a
        // plain TCP connection to it and send the password in clear text.)
        Err(e) => Inner::Http(http, NoTrustRoots(e.to_string())),
    })
}

fn client(connector: Inner) -> clickhouse::Client {
    // The request body type is the crate's own: inferred from its one client implementation.
    let pool = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(2))
        .build(Watched(connector));
    clickhouse::Client::with_http_client(pool)
}

#[derive(Clone)]
enum Inner {
    Https(hyper_rustls::HttpsConnector<HttpConnector>),
    /// Plain HTTP only, and why (an `https://` URL gets the error).
    Http(HttpConnector, NoTrustRoots),
}

/// A connector whose connections are [`WatchedStream`]s.
#[derive(Clone)]
pub struct Watched(Inner);

type Boxed = Box<dyn std::error::Error + Send + Sync>;
type Stream = hyper_rustls::MaybeHttpsStream<hyper_util::rt::TokioIo<tokio::net::TcpStream>>;

impl tower_service::Service<Uri> for Watched {
    type Response = WatchedStream<Stream>;
    type Error = Boxed;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Boxed>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Boxed>> {
        match &mut self.0 {
            Inner::Https(https) => https.poll_ready(cx),
            Inner::Http(http, _) => http.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        match &mut self.0 {
            Inner::Https(https) => {
                let connecting = https.call(uri);
                Box::pin(async move { Ok(WatchedStream::new(connecting.await?)) })
            }
            Inner::Http(_, no_roots) if uri.scheme() != Some(&hyper::http::uri::Scheme::HTTP) => {
                let refused: Boxed = Box::new(no_roots.clone());
                Box::pin(async move { Err(refused) })
            }
            Inner::Http(http, _) => {
                let connecting = http.call(uri);
                Box::pin(async move {
                    Ok(WatchedStream::new(hyper_rustls::MaybeHttpsStream::Http(
                        connecting.await?,
                    )))
                })
            }
        }
    }
}

/// Bytes of one read kept for the next, so that a pattern split between reads is found.
const CARRY: usize = 96;
/// Longest exception text reported.
const MAX_TEXT: usize = 512;
/// Longest head of an error answer read for its headers; past it, the answer is left to the
/// crate.
const MAX_HEAD: usize = 16 * 1024;

pub struct WatchedStream<S> {
    inner: S,
    watch: Watch,
}

impl<S> WatchedStream<S> {
    fn new(inner: S) -> Self {
        WatchedStream {
            inner,
            watch: Watch::default(),
        }
    }
}

/// What the watch has seen on one connection.
#[derive(Default)]
struct Watch {
    /// The `query_id` of the request last written (one at a time: HTTP/1.1, no pipelining).
    request: Option<String>,
    /// The end of what was last written.
    written: Vec<u8>,
    /// The last status line was `200`.
    ok: bool,
    /// The end of the previous read.
    carry: Vec<u8>,
    /// An error answer's head read so far, from its status line, until its headers end.
    head: Option<Vec<u8>>,
}

impl Watch {
    /// Looks at `wrote` (bytes written) for a request's `query_id` of this process's.
    /// Searched in place (a write can be a whole chunk of an INSERT's rows), and where it meets
    /// the end of the write before, for a marker and its count split between the two.
    fn wrote(&mut self, wrote: &[u8]) {
        let marker = marker();
        let keep = marker.len() + 24;
        let mut seam = std::mem::take(&mut self.written);
        seam.extend_from_slice(&wrote[..wrote.len().min(keep)]);
        let id = |bytes: &[u8]| {
            let at = memchr::memmem::rfind(bytes, marker)?;
            let id = &bytes[at + 9..];
            let end = id
                .iter()
                .position(|b| !(b.is_ascii_alphanumeric() || *b == b'-'))?;
            Some(String::from_utf8_lossy(&id[..end]).into_owned())
        };
        if let Some(request) = id(wrote).or_else(|| id(&seam)) {
            self.request = Some(request);
        }
        // The end of what was written, for the next write's seam.
        self.written = if wrote.len() >= keep {
            wrote[wrote.len() - keep..].to_vec()
        } else {
            let from = seam.len().saturating_sub(keep);
            seam.split_off(from)
        };
    }

    /// Looks at `read` (the bytes one read returned); an exception in a `200` answer, or an
    /// error status without ClickHouse's headers, is returned.
    fn saw(&mut self, read: &[u8]) -> Option<Spotted> {
        let mut window = std::mem::take(&mut self.carry);
        let carried = window.len();
        window.extend_from_slice(read);
        // Only this answer's bytes count: the carry may end the previous answer on the connection
        // (an error's body, which would otherwise be found again in the next `200`). A status
        // line starts a read or a line; "HTTP/1.1 " inside a body is not one.
        let mut answer = &window[..];
        if let Some(at) = status_line(&window, carried)
            && let Some(code) = window.get(at + 9..at + 12)
        {
            self.ok = code == b"200";
            answer = &window[at..];
            self.head = matches!(code[0], b'3' | b'4' | b'5').then(|| answer.to_vec());
        } else if let Some(head) = &mut self.head {
            head.extend_from_slice(read);
        }
        let found = match self.ok {
            true => exception(answer).map(Spotted::Exception),
            false => self.proxy_answer().map(Spotted::Proxy),
        };
        let keep = window.len().saturating_sub(CARRY);
        self.carry = window.split_off(keep);
        found
    }

    /// Once the error answer's headers have all been read: the proxy's answer when none is
    /// ClickHouse's.
    fn proxy_answer(&mut self) -> Option<ProxyAnswer> {
        let head = self.head.as_ref()?;
        let Some(end) = memchr::memmem::find(head, b"\r\n\r\n") else {
            if head.len() > MAX_HEAD {
                self.head = None;
            }
            return None;
        };
        let head = self.head.take()?;
        let head = &head[..end];
        let from_clickhouse = head
            .split(|b| *b == b'\n')
            .any(|line| line.len() >= 13 && line[..13].eq_ignore_ascii_case(b"x-clickhouse-"));
        if from_clickhouse {
            return None;
        }
        let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut words = line.splitn(3, ' ').skip(1);
        let status = words.next()?.parse().ok()?;
        let mut reason: String = words.next().unwrap_or_default().chars().take(64).collect();
        // Where a redirect points, without its query (it may quote the request's).
        let location = head
            .split(|b| *b == b'\n')
            .find(|line| line.len() > 9 && line[..9].eq_ignore_ascii_case(b"location:"))
            .map(|line| String::from_utf8_lossy(&line[9..]).trim().to_owned());
        if let Some(location) = location {
            let to: String = location
                .split('?')
                .next()
                .unwrap_or_default()
                .chars()
                .take(256)
                .collect();
            reason = format!("{reason}, to {to}: is --clickhouse-url that address?");
        }
        Some(ProxyAnswer { status, reason })
    }
}

/// Where the last status line in `window` starts: "HTTP/1.1 " — or "HTTP/1.0 ", as some load
/// balancers' own error pages begin — at the start of the window, of the read after `carried`
/// bytes of the one before, or of a line.
fn status_line(window: &[u8], carried: usize) -> Option<usize> {
    memchr::memmem::rfind_iter(window, b"HTTP/1.")
        .filter(|&at| matches!(window.get(at + 7..at + 9), Some([b'0' | b'1', b' '])))
        .find(|&at| at == 0 || at == carried || window[at - 1] == b'\n')
}

/// `Code: N. DB::Exception: …` or `Code: N, e.displayText() = DB::Exception: …` in `window`.
fn exception(window: &[u8]) -> Option<ExceptionIn200> {
    let mut from = 0;
    while let Some(found) = memchr::memmem::find(&window[from..], b"Code: ") {
        let code = from + found;
        let rest = &window[code + 6..];
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let after = &rest[digits..];
        if digits > 0
            && (after.starts_with(b". DB::Exception")
                || after.starts_with(b", e.displayText() = DB::Exception"))
        {
            let end = window[code..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(window.len(), |n| code + n);
            return Some(ExceptionIn200(
                String::from_utf8_lossy(&window[code..end.min(code + MAX_TEXT)]).into_owned(),
            ));
        }
        from = code + 6;
    }
    None
}

impl<S: Read + Unpin> Read for WatchedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut scratch = [0u8; 16 * 1024];
        let room = buf.remaining().min(scratch.len());
        let mut read = ReadBuf::new(&mut scratch[..room]);
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, read.unfilled()) {
            Poll::Ready(Ok(())) => {
                let filled = read.filled();
                if let Some(spotted) = this.watch.saw(filled) {
                    if let Some(request) = this.watch.request.take() {
                        record(request, spotted.clone());
                    }
                    return Poll::Ready(Err(spotted.into_io()));
                }
                buf.put_slice(filled);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: Write + Unpin> Write for WatchedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.watch.wrote(&buf[..written]);
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let mut left = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        let written = left;
        for buf in bufs {
            let part = left.min(buf.len());
            this.watch.wrote(&buf[..part]);
            left -= part;
            if left == 0 {
                break;
            }
        }
        Poll::Ready(Ok(written))
    }
}

impl<S: Connection> Connection for WatchedStream<S> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

/// The ClickHouse exception a failed request carried in a `200` answer, if that is what failed
/// it (it travels as an I/O error, whose `source` skips the error it wraps).
pub fn exception_in_200<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a ExceptionIn200> {
    found_in(error)
}

/// The proxy's answer that failed a request, if that is what failed it.
pub fn proxy_answer<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a ProxyAnswer> {
    found_in(error)
}

/// [`NoTrustRoots`], when it is among `error`'s causes.
pub fn no_trust_roots<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a NoTrustRoots> {
    found_in(error)
}

/// The first cause of `error` (itself included, and through `io::Error` wrappers) that is a `T`.
fn found_in<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        let wrapped = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|e| e as &dyn std::error::Error);
        if let Some(found) = wrapped.unwrap_or(error).downcast_ref::<T>() {
            return Some(found);
        }
        cause = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without trust roots an `https://` URL is refused before any connection: the password in
    /// its header never crosses the network in clear text. Plain `http://` still works.
    #[tokio::test]
    async fn without_trust_roots_https_is_refused_not_sent_in_plain_text() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let plain = client(Inner::Http(http, NoTrustRoots("none in the test".into())));
        let error = plain
            .clone()
            .with_url(format!("https://127.0.0.1:{port}"))
            .with_password("hunter2")
            .query("SELECT 1")
            .execute()
            .await
            .unwrap_err();
        assert!(
            matches!(&error, clickhouse::error::Error::Network(cause) if no_trust_roots(cause.as_ref()).is_some()),
            "{error:?}"
        );
        assert_eq!(super::super::classify(&error), crate::sink::Retry::Fatal);
        let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
        assert!(accepted.is_err(), "no connection was opened");
        // The same client reaches an http:// URL.
        let asked = tokio::spawn(
            plain
                .with_url(format!("http://127.0.0.1:{port}"))
                .query("SELECT 1")
                .execute(),
        );
        let accepted = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await;
        assert!(matches!(accepted, Ok(Ok(_))), "http:// connects");
        asked.abort();
    }

    /// The request's `query_id` is read whatever the writes (split anywhere, as hyper writes the
    /// head and the body's chunks), the last request's once another follows on the connection,
    /// and only an id of this process's: a body cannot pass for another request.
    #[test]
    fn the_request_written_is_known_by_its_query_id_whatever_the_writes() {
        let id = query_id();
        let head = format!(
            "POST /?database=d&query_id={id}&wait_end_of_query=1 HTTP/1.1\r\nhost: x\r\n\r\n"
        );
        for split in [1, 10, 20, 30, 45, 60, head.len()] {
            let mut watch = Watch::default();
            let (first, second) = head.as_bytes().split_at(split.min(head.len()));
            watch.wrote(first);
            watch.wrote(second);
            watch.wrote(b"4000\r\n rows... query_id=replay-ingest-0000-7& ...");
            assert_eq!(
                watch.request.as_deref(),
                Some(id.as_str()),
                "split at {split}"
            );
        }
        let next = query_id();
        let mut watch = Watch::default();
        watch.wrote(head.as_bytes());
        watch.wrote(format!("POST /?query_id={next} HTTP/1.1\r\n").as_bytes());
        assert_eq!(watch.request, Some(next));
    }

    /// An answer found is kept for its request, asked once; the oldest go past the bound.
    #[test]
    fn an_answer_heard_is_kept_for_its_request_once() {
        let answer = || {
            Spotted::Proxy(ProxyAnswer {
                status: 413,
                reason: "Request Entity Too Large".into(),
            })
        };
        let first = query_id();
        record(first.clone(), answer());
        for _ in 0..MOST_HEARD - 1 {
            record(query_id(), answer());
        }
        let heard = heard(&first).expect("kept");
        assert!(
            proxy_answer(&heard).is_some_and(|a| a.status == 413),
            "{heard}"
        );
        assert!(super::heard(&first).is_none(), "asked once");
        let oldest = query_id();
        record(oldest.clone(), answer());
        for _ in 0..MOST_HEARD {
            record(query_id(), answer());
        }
        assert!(super::heard(&oldest).is_none(), "past the bound");
    }

    #[test]
    fn an_exception_in_a_200_is_found_whatever_the_reads_and_only_in_a_200() {
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 61\r\n\r\nCode: 27. DB::Exception: Cannot parse input: expected '\\t'\n";
        for split in [1, 7, 40, 60, answer.len()] {
            let mut watch = Watch::default();
            let (first, second) = answer.split_at(split.min(answer.len()));
            let found = watch.saw(first).or_else(|| watch.saw(second));
            assert_eq!(
                found,
                Some(Spotted::Exception(ExceptionIn200(
                    "Code: 27. DB::Exception: Cannot parse input: expected '\\t'".into()
                ))),
                "split at {split}"
            );
        }
        let old = b"HTTP/1.1 200 OK\r\n\r\nCode: 193, e.displayText() = DB::Exception: Wrong password, e.what() = DB::Exception\n";
        assert!(matches!(
            Watch::default().saw(old),
            Some(Spotted::Exception(ExceptionIn200(text))) if text.starts_with("Code: 193, e.displayText()")
        ));
        let error = b"HTTP/1.1 500 Internal Server Error\r\nX-ClickHouse-Server-Display-Name: ch\r\n\r\nCode: 27. DB::Exception: x\n";
        assert_eq!(
            Watch::default().saw(error),
            None,
            "a non-200 answer is the crate's to read"
        );
        let mut keep_alive = Watch::default();
        assert_eq!(
            keep_alive.saw(b"HTTP/1.1 500 Internal Server Error\r\nX-ClickHouse-Exception-Code: 27\r\n\r\nCode: 27. DB::Exception: x\n"),
            None
        );
        assert!(
            keep_alive
                .saw(b"HTTP/1.1 200 OK\r\n\r\nCode: 241. DB::Exception: Memory limit\n")
                .is_some()
        );
        // An error's body carried over is not found again in the next answer, an empty `200`
        // (the other half of a batch ClickHouse refused part of, on the same connection).
        let mut after_error = Watch::default();
        let refused = b"HTTP/1.1 500 Internal Server Error\r\nx-clickhouse-summary: {}\r\nContent-Length: 38\r\n\r\nCode: 27. DB::Exception: Cannot parse\n";
        assert_eq!(after_error.saw(refused), None);
        assert_eq!(
            after_error.saw(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            None,
            "the previous answer's exception is not this one's"
        );
        // A body quoting a status line is still the body of the `200` it follows.
        let quoting =
            b"HTTP/1.1 200 OK\r\n\r\nCode: 1000. DB::Exception: remote answered HTTP/1.1 200 OK\n";
        assert!(
            Watch::default().saw(quoting).is_some(),
            "\"HTTP/1.1 \" inside the body is not a status line"
        );
        assert_eq!(Watch::default().saw(b"HTTP/1.1 200 OK\r\n\r\n"), None);
        assert_eq!(
            Watch::default().saw(b"HTTP/1.1 200 OK\r\n\r\nCode: 12 and later DB::Exception"),
            None,
            "too far apart"
        );
    }

    /// An error status without any `X-ClickHouse-…` header is a proxy's own answer, found
    /// whatever the reads; one with ClickHouse's headers (18.16 sends
    /// `X-ClickHouse-Server-Display-Name` on every answer) is the crate's to read.
    #[test]
    fn an_error_status_without_clickhouses_headers_is_a_proxys_answer() {
        let nginx = b"HTTP/1.1 413 Request Entity Too Large\r\nServer: nginx\r\nContent-Type: text/html\r\nContent-Length: 176\r\n\r\n<html><head><title>413 Request Entity Too Large</title></head></html>";
        for split in [1, 12, 30, 70, 90, nginx.len()] {
            let mut watch = Watch::default();
            let (first, second) = nginx.split_at(split);
            let found = watch.saw(first).or_else(|| watch.saw(second));
            assert_eq!(
                found,
                Some(Spotted::Proxy(ProxyAnswer {
                    status: 413,
                    reason: "Request Entity Too Large".into()
                })),
                "split at {split}"
            );
        }
        // A load balancer's own page, in HTTP/1.0 (before, not seen: retried without end).
        let mut old = Watch::default();
        assert_eq!(
            old.saw(
                b"HTTP/1.0 413 Request Entity Too Large\r\nContent-Type: text/html\r\n\r\n<html>"
            ),
            Some(Spotted::Proxy(ProxyAnswer {
                status: 413,
                reason: "Request Entity Too Large".into()
            }))
        );
        let clickhouse = b"HTTP/1.1 400 Bad Request\r\nDate: Sat, 05 Dec 2026 22:49:00 GMT\r\nConnection: Keep-Alive\r\nContent-Type: text/plain; charset=UTF-8\r\nX-ClickHouse-Server-Display-Name: vm\r\nTransfer-Encoding: chunked\r\n\r\n";
        for split in [1, 60, 100, clickhouse.len()] {
            let mut watch = Watch::default();
            let (first, second) = clickhouse.split_at(split);
            assert_eq!(
                watch.saw(first).or_else(|| watch.saw(second)),
                None,
                "split at {split}"
            );
        }
        let mut after = Watch::default();
        assert_eq!(
            after.saw(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            None
        );
        assert_eq!(
            after.saw(b"HTTP/1.1 401 Unauthorized\r\n\r\n"),
            Some(Spotted::Proxy(ProxyAnswer {
                status: 401,
                reason: "Unauthorized".into()
            })),
            "on a connection kept alive"
        );
        let error = clickhouse::error::Error::Network(Box::new(
            Spotted::Proxy(ProxyAnswer {
                status: 413,
                reason: String::new(),
            })
            .into_io(),
        ));
        assert_eq!(super::super::classify(&error), crate::sink::Retry::Rejected);
        // An ingress redirecting to https: configuration, naming where (not its query); before,
        // the crate's "301 Moved Permanently" without a code was retried as an outage.
        let redirect = b"HTTP/1.1 301 Moved Permanently\r\nLocation: https://ch.example/?query=INSERT\r\nContent-Length: 0\r\n\r\n";
        let Some(Spotted::Proxy(answer)) = Watch::default().saw(redirect) else {
            panic!("a redirect is the proxy's answer");
        };
        assert_eq!(answer.status, 301);
        assert_eq!(
            answer.reason,
            "Moved Permanently, to https://ch.example/: is --clickhouse-url that address?"
        );
        let error = clickhouse::error::Error::Network(Box::new(Spotted::Proxy(answer).into_io()));
        assert_eq!(super::super::classify(&error), crate::sink::Retry::Fatal);
    }
}
