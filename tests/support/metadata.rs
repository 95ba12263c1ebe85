//! A GCE metadata server, as GKE Workload Identity gives a pod, for the GCS client's
//! application-default credentials (`GCE_METADATA_HOST`): it hands out short-lived access tokens
//! and the universe domain, or, while told to hang, accepts each request and never answers it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Seconds each access token it gives lasts: short, so that the client fetches new ones while
/// a test runs (google-cloud-auth refreshes a token this short every 10 s, and waits for a new one
/// once it has expired).
pub const TOKEN_SECONDS: u64 = 3;

pub struct MetadataServer {
    /// `host:port`, as `GCE_METADATA_HOST` takes it.
    pub address: String,
    hanging: Arc<AtomicBool>,
    /// Requests held unanswered so far.
    held: Arc<AtomicUsize>,
    /// The home of the processes it gives credentials to: where gcloud would keep a key file.
    home: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl MetadataServer {
    pub async fn start(hanging: bool) -> MetadataServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let hanging = Arc::new(AtomicBool::new(hanging));
        let hangs = hanging.clone();
        let held = Arc::new(AtomicUsize::new(0));
        let holding = held.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut connection, _)) = listener.accept().await {
                let (hangs, holding) = (hangs.clone(), holding.clone());
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match connection.read(&mut chunk).await {
                            Ok(n @ 1..) => request.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    }
                    if hangs.load(Ordering::SeqCst) {
                        // Held, unanswered, until the client gives up or the server stops.
                        holding.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<()>().await;
                    }
                    let path = String::from_utf8_lossy(&request);
                    let (status, body) = match path.split_whitespace().nth(1).unwrap_or_default() {
                        p if p.ends_with("/service-accounts/default/token")
                            || p.contains("/service-accounts/default/token?") =>
                        {
                            let token = format!(
                                r#"{{"access_token":"test-token","expires_in":{TOKEN_SECONDS},"token_type":"Bearer"}}"#
                            );
                            ("200 OK", token)
                        }
                        p if p.ends_with("/universe/universe-domain") => {
                            ("200 OK", "googleapis.com".to_owned())
                        }
                        _ => ("404 Not Found", String::new()),
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nMetadata-Flavor: Google\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = connection.write_all(answer.as_bytes()).await;
                });
            }
        });
        MetadataServer {
            address,
            hanging,
            held,
            home: tempfile::tempdir().unwrap(),
            task,
        }
    }

    /// Whether requests from now on hang (those already held stay held).
    pub fn hang(&self, hanging: bool) {
        self.hanging.store(hanging, Ordering::SeqCst);
    }

    /// Requests held unanswered so far.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// `command` with application-default credentials from this server alone: no key file
    /// anywhere.
    pub fn credentials_for(&self, command: &mut std::process::Command) {
        command
            .env("GCE_METADATA_HOST", &self.address)
            .env("HOME", self.home.path())
            .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
            .env_remove("CLOUDSDK_CONFIG");
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Service flags `args` with GCS's application-default credentials instead of anonymous ones.
pub fn without_anonymous_gcs(args: Vec<String>) -> Vec<String> {
    args.into_iter()
        .filter(|a| a != "--gcs-anonymous")
        .collect()
}
