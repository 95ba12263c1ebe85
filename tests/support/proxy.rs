//! An HTTP/1.1 proxy in front of a stack service (the GCS emulator, ClickHouse) that forwards
//! each request whole and lets the test decide, per request, to pass the answer on, to hold it
//! back (a latency tail), to answer in the upstream's place (a load balancer that turns an
//! error into a `200`, a server that is down or refuses the data), or to hold the request itself
//! behind a [`Gate`] (a server that hangs: it takes the request and does not answer, so the
//! client meets its own deadline and gives up or tries again, as against the real server; once
//! the gate opens, what it still holds is decided again and, most often, forwarded, as a hung
//! server that resumes serves what it took). The requests it saw are counted per decision.
//! With a body limit ([`Proxy::start_with_body_limit`]) it answers a request whose body passes
//! the limit as soon as it does, reading no more of it, as nginx does past
//! `client_max_body_size` on a chunked body: the client is still sending when the answer comes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// What the proxy does with one request.
pub enum Action {
    /// The upstream's answer, at once.
    Forward,
    /// The upstream's answer (the request was made), held back this long first.
    Delay(Duration),
    /// This answer, in the upstream's place (the request is not forwarded).
    Answer {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Nothing, while the gate is closed (the request is neither forwarded nor answered, the
    /// connection left open: a hung server); once it opens, the request is decided again, as if
    /// it came then (a decision to hold it behind an open gate forwards it). A client that gives
    /// up meanwhile (its own deadline) closes its connection, and the held request goes with it.
    /// A gate open when the request comes: `Forward`.
    Hold(Gate),
}

/// Where [`Action::Hold`] keeps requests: they wait while it is closed. Clones are the same gate;
/// a new one is open.
#[derive(Clone, Default)]
pub struct Gate(Arc<GateState>);

#[derive(Default)]
struct GateState {
    closed: AtomicBool,
    opened: tokio::sync::Notify,
}

impl Gate {
    pub fn is_open(&self) -> bool {
        !self.0.closed.load(Ordering::SeqCst)
    }

    /// Lets every held request through, and holds none from now on.
    pub fn open(&self) {
        self.0.closed.store(false, Ordering::SeqCst);
        self.0.opened.notify_waiters();
    }

    /// Holds the requests sent to it until [`open`](Self::open) or the guard is dropped —
    /// also when the test fails half way, so that a flush retrying behind it can end and the
    /// runtime, which waits for its blocking threads when it shuts down, with it.
    pub fn close(&self) -> Opens {
        self.0.closed.store(true, Ordering::SeqCst);
        Opens(self.clone())
    }

    /// Returns once the gate is open.
    async fn opened(&self) {
        loop {
            // Registered before the state is read: an `open` in between still wakes it.
            let opened = self.0.opened.notified();
            if self.is_open() {
                return;
            }
            opened.await;
        }
    }
}

/// Opens its gate when dropped ([`Gate::close`]).
#[must_use = "the gate opens again when this is dropped"]
pub struct Opens(Gate);

impl Drop for Opens {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The path-and-query and body of a request, and how many requests came before it.
pub struct Seen<'a> {
    pub path: &'a str,
    pub body: &'a [u8],
    pub nth: usize,
}

type Decide = dyn Fn(&Seen) -> Action + Send + Sync;

pub struct Proxy {
    pub endpoint: String,
    pub requests: Arc<AtomicUsize>,
    pub delayed: Arc<AtomicUsize>,
    pub answered: Arc<AtomicUsize>,
    /// Requests held behind a closed gate (each counted once, however often it was held).
    pub held: Arc<AtomicUsize>,
    /// Paths of the requests, in order.
    pub paths: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// Listens on 127.0.0.1 and forwards to `upstream` (`http://host:port`).
    pub async fn start(
        upstream: &str,
        decide: impl Fn(&Seen) -> Action + Send + Sync + 'static,
    ) -> Proxy {
        Self::listen(upstream, Arc::new(decide), None).await
    }

    /// Forwards to `upstream` requests whose body is at most `limit` bytes; answers any other with
    /// `status` (an HTML page, no `X-ClickHouse-…` header) once `limit` bytes of it are read, the
    /// rest unread and the connection closed.
    pub async fn start_with_body_limit(upstream: &str, limit: usize, status: u16) -> Proxy {
        Self::listen(
            upstream,
            Arc::new(|_: &Seen| Action::Forward),
            Some((limit, status)),
        )
        .await
    }

    async fn listen(
        upstream: &str,
        decide: Arc<Decide>,
        body_limit: Option<(usize, u16)>,
    ) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            endpoint: format!("http://{}", listener.local_addr().unwrap()),
            requests: Arc::default(),
            delayed: Arc::default(),
            answered: Arc::default(),
            held: Arc::default(),
            paths: Arc::default(),
        };
        let shared = Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
            decide,
            body_limit,
            requests: proxy.requests.clone(),
            delayed: proxy.delayed.clone(),
            answered: proxy.answered.clone(),
            held: proxy.held.clone(),
            paths: proxy.paths.clone(),
        };
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request| shared.clone().handle(request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        proxy
    }
}

#[derive(Clone)]
struct Shared {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    decide: Arc<Decide>,
    requests: Arc<AtomicUsize>,
    delayed: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    paths: Arc<Mutex<Vec<String>>>,
    /// A body longer than this is answered with the status as soon as it passes it.
    body_limit: Option<(usize, u16)>,
}

impl Shared {
    async fn handle(self, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let (mut parts, mut body) = request.into_parts();
        let mut read = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                read.extend_from_slice(&data);
            }
            if let Some((limit, status)) = self.body_limit
                && read.len() > limit
            {
                self.requests.fetch_add(1, Ordering::SeqCst);
                self.answered.fetch_add(1, Ordering::SeqCst);
                let page =
                    format!("<html><head><title>{status}</title></head><body>nginx</body></html>");
                return Ok(Response::builder()
                    .status(status)
                    .header("Content-Type", "text/html")
                    .header("Connection", "close")
                    .body(Full::new(Bytes::from(page)))
                    .unwrap());
            }
        }
        let body = Bytes::from(read);
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        let nth = self.requests.fetch_add(1, Ordering::SeqCst);
        self.paths.lock().unwrap().push(path.clone());
        let seen = Seen {
            path: &path,
            body: &body,
            nth,
        };
        let mut action = (self.decide)(&seen);
        let mut counted = false;
        while let Action::Hold(gate) = action {
            if gate.is_open() {
                action = Action::Forward;
                break;
            }
            if !counted {
                self.held.fetch_add(1, Ordering::SeqCst);
                counted = true;
            }
            gate.opened().await;
            action = (self.decide)(&seen);
        }
        if let Action::Answer {
            status,
            headers,
            body,
        } = action
        {
            self.answered.fetch_add(1, Ordering::SeqCst);
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            return Ok(response.body(Full::new(Bytes::from(body))).unwrap());
        }
        parts.uri = format!("{}{path}", self.upstream).parse().unwrap();
        parts.headers.remove(hyper::header::HOST);
        let answer = match self
            .client
            .request(Request::from_parts(parts, Full::new(body)))
            .await
        {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                Response::from_parts(parts, Full::new(body))
            }
            Err(error) => Response::builder()
                .status(502)
                .body(Full::new(Bytes::from(error.to_string())))
                .unwrap(),
        };
        if let Action::Delay(delay) = action {
            self.delayed.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
        }
        Ok(answer)
    }
}
