//! Application-default credentials for GCS whose every fetch of a token has a deadline.
//!
//! google-cloud-auth keeps the token in a cache that a task of its own refreshes. With credentials
//! from the metadata server (GKE Workload Identity), that refresh is an HTTP request without a
//! deadline: a metadata server that accepts and never answers hangs it for good, and once the
//! token expires every request waits on it. Each upload then timed out, for ever (each timeout
//! counting as progress, so liveness never restarted the pod, which is what would have fixed it).
//! Here a fetch past its deadline fails as retryable, and credentials waited on that long and
//! built at least four deadlines ago are built again: a new cache, whose refresh is a new request
//! (the old one's task is stopped with it). Once per set of credentials, whatever the number of
//! uploads waiting; and not sooner, so that a metadata server slower than the deadline still
//! gets to answer the fetch under way.
//!
//! A refusal (an error google-cloud-auth says retrying will not help: a 4xx from the metadata
//! server or the token endpoint, a token it cannot read) stops the cache for good: it refreshes
//! no more and hands out that error. One refresh answered so during a blip (a node's metadata
//! server restarting, an IAM hiccup) stopped every pod on the node, and a restart meeting the
//! same blip stopped again. So refused credentials are built again, at most once a deadline, and
//! the refusal is retried for [`REFUSED_FOR`]; only a refusal that lasts is taken as final (the
//! sink stops on it: a revoked key, a removed Workload Identity binding).

use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use google_cloud_auth::credentials::{
    Builder, CacheableResource, Credentials, CredentialsProvider,
};
use google_cloud_auth::errors::CredentialsError;
use hyper::http::{Extensions, HeaderMap};
use tokio::time::Instant;
use tracing::warn;

use super::{Retry, SinkError};

/// How long refused credentials are built again and retried before the refusal is final.
pub const REFUSED_FOR: Duration = Duration::from_secs(60);

/// Application-default credentials, each token fetch within `deadline` (shorter than the
/// request that waits for it, so that the credentials are built again before that request
/// gives up).
pub fn application_default(deadline: Duration) -> Result<Credentials, SinkError> {
    let first = Builder::default()
        .build()
        .map_err(|e| SinkError::new("gcs", Retry::Fatal, format_args!("GCS credentials: {e}")))?;
    Ok(Credentials::from(WithDeadline {
        current: RwLock::new(Built::new(first)),
        build: Arc::new(move || Builder::default().build().map_err(|e| e.to_string())),
        deadline,
        universe_domain: OnceLock::new(),
        refusals: Mutex::default(),
    }))
}

type Build = Arc<dyn Fn() -> Result<Credentials, String> + Send + Sync>;

struct WithDeadline {
    current: RwLock<Built>,
    build: Build,
    deadline: Duration,
    /// The universe domain, once asked (the client asks once per inner client it builds).
    universe_domain: OnceLock<Option<String>>,
    /// The refusals of the fetches since the last token, if any: since when, and the last.
    refusals: Mutex<Option<Refusals>>,
}

/// A run of refusals: the first and the last. Only a token ends it; a refusal more than
/// [`REFUSED_FOR`] after the last starts a new one (a blip, transient failures, a blip again).
#[derive(Clone, Copy)]
struct Refusals {
    since: Instant,
    last: Instant,
}

/// Credentials, and when they were built.
struct Built {
    credentials: Credentials,
    at: Instant,
}

impl Built {
    fn new(credentials: Credentials) -> Built {
        Built {
            credentials,
            at: Instant::now(),
        }
    }
}

impl std::fmt::Debug for WithDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithDeadline")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl WithDeadline {
    /// The credentials, and when they were built (which tells them apart).
    fn current(&self) -> (Credentials, Instant) {
        let current = self
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        (current.credentials.clone(), current.at)
    }

    /// Builds the credentials again if they are still those built `at` and at least `age` old;
    /// whether it did.
    fn rebuild(&self, at: Instant, age: Duration) -> bool {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.at != at || at.elapsed() < age {
            return false;
        }
        match (self.build)() {
            Ok(fresh) => {
                *current = Built::new(fresh);
                true
            }
            // Said, or the operator sees only "no access token within …" (a key file unreadable
            // half way through its rotation, say); the ones built before stay.
            Err(error) => {
                tracing::warn!(%error, "GCS credentials could not be built again; the ones built before are kept");
                false
            }
        }
    }
}

impl WithDeadline {
    fn refusals(&self) -> std::sync::MutexGuard<'_, Option<Refusals>> {
        self.refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The credentials built `at` were refused (`error`): built again, and the refusal retried
    /// (a transient error), until a run of refusals, none more than [`REFUSED_FOR`] after the
    /// one before, has lasted [`REFUSED_FOR`]; then `error` itself.
    fn refused(&self, at: Instant, error: CredentialsError) -> CredentialsError {
        let now = Instant::now();
        let since = {
            let mut refusals = self.refusals();
            let run = match *refusals {
                Some(run) if now.duration_since(run.last) <= REFUSED_FOR => {
                    Refusals { last: now, ..run }
                }
                _ => Refusals {
                    since: now,
                    last: now,
                },
            };
            *refusals = Some(run);
            run.since
        };
        if now.duration_since(since) >= REFUSED_FOR {
            return error;
        }
        if self.rebuild(at, self.deadline) {
            warn!(%error, "GCS credentials refused: built again, and retried for up to a minute before the refusal is taken as final");
        }
        CredentialsError::new(
            true,
            format!(
                "credentials refused for {:?} so far (retried, built again, for up to {REFUSED_FOR:?})",
                since.elapsed()
            ),
            error,
        )
    }
}

impl CredentialsProvider for WithDeadline {
    async fn headers(
        &self,
        extensions: Extensions,
    ) -> Result<CacheableResource<HeaderMap>, CredentialsError> {
        let (current, at) = self.current();
        match tokio::time::timeout(self.deadline, current.headers(extensions)).await {
            Ok(Err(error)) if !error.is_transient() => Err(self.refused(at, error)),
            // A refusal's clock runs on through transient failures (a revoked key beside a
            // flaky metadata server is still final a minute on); a token ends it.
            Ok(Err(error)) => Err(error),
            Ok(Ok(headers)) => {
                *self.refusals() = None;
                Ok(headers)
            }
            Err(_) => {
                if self.rebuild(at, 4 * self.deadline) {
                    warn!(
                        deadline_ms = self.deadline.as_millis() as u64,
                        "no GCS access token within the deadline (is the metadata server answering?): the credentials are built again"
                    );
                }
                Err(CredentialsError::from_msg(
                    true,
                    format!(
                        "no access token within {:?} (the metadata server does not answer?)",
                        self.deadline
                    ),
                ))
            }
        }
    }

    /// Asked once, as the client is built. The metadata server's answer, or none within the
    /// deadline: the client then takes the default (`googleapis.com`), as google-cloud-auth
    /// itself does when the metadata server fails. A metadata server that accepted and never
    /// answered stopped the start after the sink timeout, and every restart met it again, in a
    /// crash loop (its backoff growing to minutes) past the metadata server's return; now its
    /// tokens are waited for as any destination that does not answer at start is.
    async fn universe_domain(&self) -> Option<String> {
        if let Some(known) = self.universe_domain.get() {
            return known.clone();
        }
        let (current, _) = self.current();
        let domain = tokio::time::timeout(self.deadline, current.universe_domain())
            .await
            .unwrap_or_else(|_| {
                warn!(
                    deadline_ms = self.deadline.as_millis() as u64,
                    "no universe domain from the metadata server within the deadline: the GCS client takes googleapis.com"
                );
                None
            });
        self.universe_domain.get_or_init(|| domain).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Credentials whose token never comes, or comes at once.
    #[derive(Debug)]
    struct Fake {
        hangs: bool,
    }

    impl CredentialsProvider for Fake {
        async fn headers(
            &self,
            _: Extensions,
        ) -> Result<CacheableResource<HeaderMap>, CredentialsError> {
            if self.hangs {
                std::future::pending::<()>().await;
            }
            Ok(CacheableResource::NotModified)
        }

        async fn universe_domain(&self) -> Option<String> {
            if self.hangs {
                std::future::pending::<()>().await;
            }
            Some("example.com".to_owned())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_universe_domain_that_does_not_come_is_the_default_after_the_deadline() {
        let with = |hangs| WithDeadline {
            current: RwLock::new(Built::new(Credentials::from(Fake { hangs }))),
            build: Arc::new(|| Err("not built again".to_owned())),
            deadline: Duration::from_secs(5),
            universe_domain: OnceLock::new(),
            refusals: Mutex::default(),
        };
        let started = tokio::time::Instant::now();
        let hung = with(true);
        assert_eq!(hung.universe_domain().await, None);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(hung.universe_domain().await, None);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(5),
            "asked again (the client builds two inner clients): not waited for again"
        );
        assert_eq!(
            with(false).universe_domain().await.as_deref(),
            Some("example.com")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_that_does_not_come_fails_in_time_and_the_credentials_are_built_again() {
        let builds = Arc::new(AtomicUsize::new(0));
        let counted = builds.clone();
        let credentials = WithDeadline {
            current: RwLock::new(Built::new(Credentials::from(Fake { hangs: true }))),
            build: Arc::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(Credentials::from(Fake { hangs: false }))
            }),
            deadline: Duration::from_secs(5),
            universe_domain: OnceLock::new(),
            refusals: Mutex::default(),
        };
        let started = tokio::time::Instant::now();
        let error = credentials
            .headers(Extensions::new())
            .await
            .expect_err("the hung fetch fails");
        assert!(error.is_transient(), "{error}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(
            builds.load(Ordering::SeqCst),
            0,
            "too young to be built again"
        );
        // Ten uploads waiting at once, the credentials old enough: built again once.
        tokio::time::advance(Duration::from_secs(15)).await;
        let waiting = (0..10).map(|_| credentials.headers(Extensions::new()));
        let answers = futures::future::join_all(waiting).await;
        assert!(answers.iter().all(Result::is_err));
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(
            credentials.headers(Extensions::new()).await.is_ok(),
            "the credentials built again answer"
        );
        assert_eq!(builds.load(Ordering::SeqCst), 1, "not built again after");
    }

    /// Credentials google-cloud-auth's cache has stopped on: every fetch refused.
    #[derive(Debug)]
    struct Refused;

    impl CredentialsProvider for Refused {
        async fn headers(
            &self,
            _: Extensions,
        ) -> Result<CacheableResource<HeaderMap>, CredentialsError> {
            Err(CredentialsError::from_msg(
                false,
                "metadata server answered 404",
            ))
        }

        async fn universe_domain(&self) -> Option<String> {
            None
        }
    }

    fn refused_then(fresh: fn() -> Credentials, builds: &Arc<AtomicUsize>) -> WithDeadline {
        let counted = builds.clone();
        WithDeadline {
            current: RwLock::new(Built::new(Credentials::from(Refused))),
            build: Arc::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(fresh())
            }),
            deadline: Duration::from_secs(5),
            universe_domain: OnceLock::new(),
            refusals: Mutex::default(),
        }
    }

    /// A refusal during a blip: retried (transient) and the credentials built again, whose
    /// token comes; before, the refusal was final at once and the service stopped.
    #[tokio::test(start_paused = true)]
    async fn refused_credentials_are_built_again_and_retried_before_the_refusal_is_final() {
        let builds = Arc::new(AtomicUsize::new(0));
        let credentials = refused_then(|| Credentials::from(Fake { hangs: false }), &builds);
        let error = credentials.headers(Extensions::new()).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert_eq!(
            builds.load(Ordering::SeqCst),
            0,
            "too young to be built again"
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        let error = credentials.headers(Extensions::new()).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(credentials.headers(Extensions::new()).await.is_ok());
        assert!(credentials.refusals().is_none(), "the refusals are over");
    }

    /// Credentials refused and failing transiently in turn (a revoked key, a flaky metadata
    /// server).
    #[derive(Debug, Default)]
    struct Flaky(AtomicUsize);

    impl CredentialsProvider for Flaky {
        async fn headers(
            &self,
            _: Extensions,
        ) -> Result<CacheableResource<HeaderMap>, CredentialsError> {
            let transient = self.0.fetch_add(1, Ordering::SeqCst) % 2 == 1;
            Err(CredentialsError::from_msg(
                transient,
                "refused, or not answering",
            ))
        }

        async fn universe_domain(&self) -> Option<String> {
            None
        }
    }

    /// A refusal that lasts through transient failures is final all the same: they do not start
    /// its minute again (each did, and the refusal was retried for ever).
    #[tokio::test(start_paused = true)]
    async fn transient_failures_between_refusals_do_not_start_the_minute_again() {
        let builds = Arc::new(AtomicUsize::new(0));
        let credentials = refused_then(|| Credentials::from(Flaky::default()), &builds);
        let started = Instant::now();
        loop {
            let error = credentials.headers(Extensions::new()).await.unwrap_err();
            if !error.is_transient() {
                break;
            }
            assert!(started.elapsed() < 2 * REFUSED_FOR, "never final");
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(started.elapsed() >= REFUSED_FOR);
    }

    /// A refusal, minutes of timeouts (a metadata server restarting), and a refusal again as it
    /// comes back: a new run, retried, not final at once (the first refusal's clock had run on).
    #[tokio::test(start_paused = true)]
    async fn a_refusal_long_after_the_last_starts_a_new_run() {
        let builds = Arc::new(AtomicUsize::new(0));
        let credentials = refused_then(|| Credentials::from(Refused), &builds);
        assert!(
            credentials
                .headers(Extensions::new())
                .await
                .unwrap_err()
                .is_transient()
        );
        tokio::time::advance(REFUSED_FOR * 3).await;
        let error = credentials.headers(Extensions::new()).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
    }

    /// A refusal that lasts (a revoked key): final once it has lasted `REFUSED_FOR`, however
    /// often the credentials are built again.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_that_lasts_is_final() {
        let builds = Arc::new(AtomicUsize::new(0));
        let credentials = refused_then(|| Credentials::from(Refused), &builds);
        let mut transient = 0;
        loop {
            let error = credentials.headers(Extensions::new()).await.unwrap_err();
            if !error.is_transient() {
                break;
            }
            transient += 1;
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(
            transient,
            REFUSED_FOR.as_secs(),
            "one a second until the last"
        );
        let built = builds.load(Ordering::SeqCst);
        assert!((10..=12).contains(&built), "once a deadline: {built}");
    }
}
