//! The bucket operations of the operator tools — listing objects, deleting them, reading the
//! bucket's lifecycle rules and soft-delete policy — over the Cloud Storage JSON API
//! (`/storage/v1/…`), with the same endpoint and credentials as the sink. (The official crate's
//! `StorageControl` speaks gRPC, which the local emulator does not; objects are still read with
//! the official client.) Listing and deleting take every generation of an object: a bucket with
//! Object Versioning keeps each delete's (and each rewrite's) noncurrent copy, which a privacy
//! delete must remove too.

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::RngExt;
use serde::Deserialize;

use super::gcs::{GcsConfig, GcsSink};
use super::store::{BlobStore, Listing, StoredObject};
use super::{Retry, SinkError};

const DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com";

/// Tries of one JSON API call that fails retryably but for a timeout ([`GcsStore::call`]).
const CALL_TRIES: u32 = 3;

/// The backoff before a call's second try (doubled before the third), jittered ±50 %.
const CALL_BACKOFF: Duration = Duration::from_millis(250);

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// A bucket, for the operator tools: listed and deleted from through the JSON API, read through
/// the official client.
pub struct GcsStore {
    http: Client<Https, Empty<Bytes>>,
    endpoint: String,
    bucket: String,
    /// `None` with `--gcs-anonymous` (emulators).
    credentials: Option<google_cloud_auth::credentials::Credentials>,
    timeout: Duration,
    objects: GcsSink,
}

/// One lifecycle rule of a bucket, as far as expiry goes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LifecycleRule {
    pub action: RuleAction,
    #[serde(default)]
    pub condition: RuleCondition,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RuleAction {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RuleCondition {
    pub age: Option<u32>,
    #[serde(default, rename = "matchesPrefix")]
    pub matches_prefix: Vec<String>,
    /// Any other condition (`isLive`, `matchesSuffix`, `createdBefore`, …): the rule may then
    /// spare some live objects.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct ObjectList {
    #[serde(default)]
    items: Vec<ObjectResource>,
    #[serde(default)]
    prefixes: Vec<String>,
    #[serde(rename = "nextPageToken")]
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
struct ObjectResource {
    name: String,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    updated: Option<String>,
    /// Which version of the object (int64, as a string).
    #[serde(default)]
    generation: Option<String>,
}

#[derive(Deserialize)]
struct BucketSoftDelete {
    #[serde(rename = "softDeletePolicy", default)]
    soft_delete_policy: Option<SoftDeletePolicy>,
}

#[derive(Deserialize)]
struct SoftDeletePolicy {
    /// How long a deleted object stays restorable (int64 seconds, as a string).
    #[serde(rename = "retentionDurationSeconds", default)]
    retention_duration_seconds: Option<String>,
}

#[derive(Deserialize)]
struct BucketLifecycle {
    #[serde(default)]
    lifecycle: Option<Lifecycle>,
}

#[derive(Deserialize)]
struct Lifecycle {
    #[serde(default)]
    rule: Vec<LifecycleRule>,
}

impl GcsStore {
    pub async fn new(config: &GcsConfig) -> Result<GcsStore, SinkError> {
        let objects = GcsSink::new(config).await?;
        let credentials = if config.anonymous {
            None
        } else {
            Some(super::gcs_credentials::application_default(
                config.timeout / 2,
            )?)
        };
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::aws_lc_rs::default_provider())
            .map_err(|e| SinkError::new("gcs", Retry::Fatal, format_args!("TLS roots: {e}")))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(GcsStore {
            http: Client::builder(TokioExecutor::new()).build(https),
            endpoint: config
                .endpoint
                .clone()
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
                .trim_end_matches('/')
                .to_owned(),
            bucket: config.bucket.clone(),
            credentials,
            timeout: config.timeout,
            objects,
        })
    }

    /// One JSON API call (every one is idempotent: a read, or a delete of one generation, which
    /// answers 404 once done); the status and the body. 408, 429, 5xx and a connection that
    /// fails are tried again, [`CALL_TRIES`] times in all with a short backoff, as Google's
    /// client libraries do: over a privacy request's thousands of objects, a few such answers are
    /// to be expected, and each failed a replay (three in a row stopped the run). A call that
    /// times out is not: a store that hangs would hold each call for several timeouts. Then
    /// retryable, other 4xx fatal (the caller treats the 404 it expects).
    async fn call(&self, method: Method, path: &str) -> Result<(StatusCode, Bytes), SinkError> {
        let mut tries = 1;
        loop {
            let call = tokio::time::timeout(self.timeout, self.call_once(method.clone(), path));
            match call.await {
                Err(_) => {
                    return Err(SinkError::new(
                        "gcs",
                        Retry::Retryable,
                        format_args!("{path}: timed out after {:?}", self.timeout),
                    ));
                }
                Ok(Err(error)) if error.retry == Retry::Retryable && tries < CALL_TRIES => {
                    let pause = CALL_BACKOFF * 2u32.pow(tries - 1);
                    let jitter = 0.5 + rand::rng().random::<f64>();
                    tokio::time::sleep(pause.mul_f64(jitter)).await;
                    tries += 1;
                }
                Ok(ended) => return ended,
            }
        }
    }

    async fn call_once(
        &self,
        method: Method,
        path: &str,
    ) -> Result<(StatusCode, Bytes), SinkError> {
        // The token too is fetched under the deadline: from the metadata server, its connection
        // has none of its own.
        let exchange = async {
            let mut request = Request::builder()
                .method(method)
                .uri(format!("{}{path}", self.endpoint));
            if let Some(credentials) = &self.credentials {
                let headers = credentials
                    .headers(hyper::http::Extensions::new())
                    .await
                    .map_err(|e| {
                        // As the sink's `gcs::classify`: credentials refused for good are fatal.
                        let retry = match e.is_transient() {
                            true => Retry::Retryable,
                            false => Retry::Fatal,
                        };
                        SinkError::new("gcs", retry, format_args!("GCS credentials: {e}"))
                    })?;
                if let google_cloud_auth::credentials::CacheableResource::New { data, .. } = headers
                {
                    for (name, value) in &data {
                        request = request.header(name, value);
                    }
                }
            }
            let request = request
                .body(Empty::new())
                .map_err(|e| SinkError::new("gcs", Retry::Fatal, e))?;
            let sent = async {
                let response = self.http.request(request).await?;
                let status = response.status();
                let body = response.into_body().collect().await?.to_bytes();
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
            };
            sent.await
                .map_err(|e| SinkError::new("gcs", Retry::Retryable, format_args!("{path}: {e}")))
        };
        let (status, body) = exchange.await?;
        match status.as_u16() {
            200..=299 | 404 => Ok((status, body)),
            code => {
                let retry = match code {
                    408 | 429 | 500..=599 => Retry::Retryable,
                    _ => Retry::Fatal,
                };
                let text = String::from_utf8_lossy(&body);
                let text: String = text.chars().take(300).collect();
                Err(SinkError::new(
                    "gcs",
                    retry,
                    format_args!("{path}: {status}: {text}"),
                ))
            }
        }
    }

    /// The body of a GET of the bucket or of its objects; the bucket missing is fatal (no retry
    /// creates it).
    async fn get_in_bucket(&self, path: &str) -> Result<Bytes, SinkError> {
        let (status, body) = self.call(Method::GET, path).await?;
        if status == StatusCode::NOT_FOUND {
            return Err(SinkError::new(
                "gcs",
                Retry::Fatal,
                format_args!("bucket {} not found", self.bucket),
            ));
        }
        Ok(body)
    }

    /// The objects and sub-prefixes directly under `prefix`, an object once whatever its
    /// versions (one whose live version is gone but a noncurrent one is kept is listed too).
    async fn list_now(&self, prefix: &str) -> Result<Listing, SinkError> {
        let mut listing = Listing::default();
        for list in self.list_pages(prefix, true).await? {
            listing.objects.extend(list.items.into_iter().map(|o| {
                StoredObject {
                    size: o.size.and_then(|s| s.parse().ok()).unwrap_or(0),
                    updated: o
                        .updated
                        .and_then(|u| humantime::parse_rfc3339_weak(&u).ok())
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_secs() as i64),
                    key: o.name,
                }
            }));
            listing.prefixes.extend(list.prefixes);
        }
        listing.objects.sort_by(|a, b| a.key.cmp(&b.key));
        listing.objects.dedup_by(|a, b| a.key == b.key);
        listing.prefixes.sort();
        listing.prefixes.dedup();
        Ok(listing)
    }

    /// Every page of the listing of `prefix` with all versions of each object; one level only
    /// (`/` as the delimiter) or everything under it.
    async fn list_pages(
        &self,
        prefix: &str,
        one_level: bool,
    ) -> Result<Vec<ObjectList>, SinkError> {
        let mut pages = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut path = format!(
                "/storage/v1/b/{}/o?versions=true&prefix={}&fields=items(name%2Csize%2Cupdated%2Cgeneration)%2Cprefixes%2CnextPageToken",
                encode(&self.bucket),
                encode(prefix)
            );
            if one_level {
                path.push_str("&delimiter=%2F");
            }
            if let Some(token) = &page {
                path.push_str(&format!("&pageToken={}", encode(token)));
            }
            let body = self.get_in_bucket(&path).await?;
            let list: ObjectList = serde_json::from_slice(&body).map_err(|e| {
                SinkError::new(
                    "gcs",
                    Retry::Retryable,
                    format_args!("listing {prefix}: {e}"),
                )
            })?;
            page = list.next_page_token.clone().filter(|t| !t.is_empty());
            pages.push(list);
            if page.is_none() {
                return Ok(pages);
            }
        }
    }

    /// Deletes every version of the object `key` (the live one and those a versioned bucket
    /// keeps); `false` when there was none.
    async fn delete_now(&self, key: &str) -> Result<bool, SinkError> {
        let object = format!("/storage/v1/b/{}/o/{}", encode(&self.bucket), encode(key));
        let mut deleted = false;
        for list in self.list_pages(key, false).await? {
            for version in list.items.iter().filter(|o| o.name == key) {
                let path = match &version.generation {
                    Some(generation) => format!("{object}?generation={}", encode(generation)),
                    None => object.clone(),
                };
                let (status, _) = self.call(Method::DELETE, &path).await?;
                deleted |= status != StatusCode::NOT_FOUND;
            }
        }
        Ok(deleted)
    }

    /// How long the bucket keeps a deleted object restorable (its soft-delete policy); `None`
    /// when it does not.
    pub async fn soft_delete_retention(&self) -> Result<Option<Duration>, SinkError> {
        let path = format!(
            "/storage/v1/b/{}?fields=softDeletePolicy",
            encode(&self.bucket)
        );
        let body = self.get_in_bucket(&path).await?;
        soft_delete_retention(&body)
            .map_err(|e| SinkError::new("gcs", Retry::Retryable, format_args!("soft delete: {e}")))
    }

    /// The bucket's lifecycle rules (none when it has no lifecycle configuration).
    pub async fn lifecycle(&self) -> Result<Vec<LifecycleRule>, SinkError> {
        let path = format!("/storage/v1/b/{}?fields=lifecycle", encode(&self.bucket));
        let body = self.get_in_bucket(&path).await?;
        let bucket: BucketLifecycle = serde_json::from_slice(&body)
            .map_err(|e| SinkError::new("gcs", Retry::Retryable, format_args!("lifecycle: {e}")))?;
        Ok(bucket.lifecycle.map(|l| l.rule).unwrap_or_default())
    }
}

/// A retention prefix whose blobs the bucket's lifecycle rules do not delete at its age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    /// A rule deletes them after `age` days, before their retention: recordings go while their
    /// rows are still listed.
    Early { retention: u16, age: u32 },
    /// No rule deletes them at their retention: they are kept past it.
    Late { retention: u16 },
}

/// The retentions among `retentions` whose blobs `rules` do not delete at their age. A `Delete`
/// rule applies to a prefix when its only conditions are an age and, if any, a `matchesPrefix`
/// that holds `{retention}/` (without one it applies to every object); one with another condition
/// (`isLive`, `matchesSuffix`, …) may spare some objects and is not counted. A prefix is covered
/// when a rule applies to it at exactly its retention and none applies earlier.
pub fn lifecycle_gaps(rules: &[LifecycleRule], retentions: &[u16]) -> Vec<Gap> {
    // Each applicable rule's age for `retention` (a rule without one deletes at once).
    let ages = |retention: u16| -> Vec<u32> {
        let prefix = format!("{retention}/");
        rules
            .iter()
            .filter(|rule| {
                let condition = &rule.condition;
                rule.action.kind == "Delete"
                    && condition.other.is_empty()
                    && (condition.matches_prefix.is_empty()
                        || condition
                            .matches_prefix
                            .iter()
                            .any(|p| prefix.starts_with(p.as_str())))
            })
            .map(|rule| rule.condition.age.unwrap_or(0))
            .collect()
    };
    retentions
        .iter()
        .copied()
        .filter_map(|retention| {
            let (at, ages) = (u32::from(retention), ages(retention));
            match ages.iter().min() {
                Some(&age) if age < at => Some(Gap::Early { retention, age }),
                _ if ages.contains(&at) => None,
                _ => Some(Gap::Late { retention }),
            }
        })
        .collect()
}

impl GcsStore {
    /// The retention prefixes the bucket holds blobs under that its lifecycle rules do not
    /// expire at their age.
    pub async fn lifecycle_gaps(&self) -> Result<Vec<Gap>, SinkError> {
        let retentions: Vec<u16> = self
            .list_now("")
            .await?
            .prefixes
            .iter()
            .filter_map(|p| p.trim_end_matches('/').parse().ok())
            .collect();
        Ok(lifecycle_gaps(&self.lifecycle().await?, &retentions))
    }
}

impl BlobStore for GcsStore {
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, SinkError>> {
        Box::pin(self.list_now(prefix))
    }

    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, SinkError>> {
        Box::pin(self.objects.read(key))
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, SinkError>> {
        Box::pin(self.delete_now(key))
    }

    fn kept_after_delete(&self) -> BoxFuture<'_, Result<Option<String>, SinkError>> {
        Box::pin(async move {
            Ok(self.soft_delete_retention().await?.map(|kept| {
                format!(
                    "gs://{} keeps deleted objects restorable for {} (its soft-delete policy): the blobs removed here can be restored until then; set the policy's retention to 0 for deletes to be final at once",
                    self.bucket,
                    humantime::format_duration(kept)
                )
            }))
        })
    }

    fn location(&self, key: &str) -> String {
        format!("gs://{}/{key}", self.bucket)
    }
}

/// How long a bucket (its JSON resource) keeps deleted objects restorable; `None` when it does
/// not (no policy, or a retention of 0).
fn soft_delete_retention(bucket: &[u8]) -> Result<Option<Duration>, serde_json::Error> {
    let bucket: BucketSoftDelete = serde_json::from_slice(bucket)?;
    Ok(bucket
        .soft_delete_policy
        .and_then(|p| p.retention_duration_seconds)
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map(Duration::from_secs))
}

/// Percent-encodes everything but RFC 3986's unreserved characters (an object name in a path
/// segment, a prefix in a query).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_as_one_path_segment() {
        assert_eq!(encode("90/42/ab-c/0"), "90%2F42%2Fab-c%2F0");
        assert_eq!(encode("dlq/t/0/17.key"), "dlq%2Ft%2F0%2F17.key");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn a_retention_is_covered_by_a_delete_rule_at_exactly_its_age_and_none_earlier() {
        let rule = |kind: &str, age, prefixes: &[&str]| LifecycleRule {
            action: RuleAction { kind: kind.into() },
            condition: RuleCondition {
                age: Some(age),
                matches_prefix: prefixes.iter().map(|p| p.to_string()).collect(),
                other: Default::default(),
            },
        };
        use Gap::{Early, Late};
        let rules = [rule("Delete", 30, &["30/"]), rule("Delete", 90, &["90/"])];
        assert!(lifecycle_gaps(&rules, &[30, 90]).is_empty());
        let rules = [rule("Delete", 30, &["30/"]), rule("Delete", 60, &["90/"])];
        assert_eq!(
            lifecycle_gaps(&rules, &[30, 90]),
            [Early {
                retention: 90,
                age: 60
            }]
        );
        let rules = [rule("Delete", 30, &[]), rule("Delete", 90, &["90/"])];
        assert_eq!(
            lifecycle_gaps(&rules, &[30, 90]),
            [Early {
                retention: 90,
                age: 30
            }],
            "a rule for the whole bucket at 30 days deletes 90/ early"
        );
        assert_eq!(
            lifecycle_gaps(&[rule("SetStorageClass", 90, &["90/"])], &[90]),
            [Late { retention: 90 }]
        );
        assert_eq!(
            lifecycle_gaps(&[rule("Delete", 90, &[])], &[30, 90]),
            [Late { retention: 30 }],
            "a rule for all at 90 days leaves 30/ blobs 60 days past their retention"
        );
        assert!(lifecycle_gaps(&[rule("Delete", 30, &[])], &[30]).is_empty());
        assert_eq!(
            lifecycle_gaps(&[rule("Delete", 365, &["30/"])], &[30]),
            [Late { retention: 30 }],
            "expires, but 335 days late"
        );
        let mut spares_live = rule("Delete", 30, &["30/"]);
        spares_live
            .condition
            .other
            .insert("isLive".into(), serde_json::Value::Bool(false));
        assert_eq!(
            lifecycle_gaps(&[spares_live], &[30]),
            [Late { retention: 30 }],
            "a rule for noncurrent versions only"
        );
        assert_eq!(lifecycle_gaps(&[], &[30]), [Late { retention: 30 }]);
    }

    #[test]
    fn lifecycle_rules_parse_as_the_json_api_returns_them() {
        let body = br#"{"lifecycle":{"rule":[{"action":{"type":"Delete"},"condition":{"age":90,"matchesPrefix":["90/"]}},{"action":{"type":"SetStorageClass","storageClass":"COLDLINE"},"condition":{"age":30}}]}}"#;
        let bucket: BucketLifecycle = serde_json::from_slice(body).unwrap();
        let rules = bucket.lifecycle.unwrap().rule;
        assert_eq!(rules[0].action.kind, "Delete");
        assert_eq!(rules[0].condition.age, Some(90));
        assert_eq!(rules[0].condition.matches_prefix, ["90/"]);
        assert!(rules[1].condition.matches_prefix.is_empty());
        let none: BucketLifecycle = serde_json::from_slice(b"{}").unwrap();
        assert!(none.lifecycle.is_none());
    }

    #[test]
    fn a_soft_delete_policy_parses_as_the_json_api_returns_it() {
        let kept = |body: &str| soft_delete_retention(body.as_bytes()).unwrap();
        let week = br#"{"softDeletePolicy":{"retentionDurationSeconds":"604800","effectiveTime":"2024-03-01T00:00:00Z"}}"#;
        assert_eq!(
            soft_delete_retention(week).unwrap(),
            Some(Duration::from_secs(604_800))
        );
        assert_eq!(
            kept(r#"{"softDeletePolicy":{"retentionDurationSeconds":"0"}}"#),
            None
        );
        assert_eq!(kept("{}"), None, "the emulator's, and a bucket without one");
    }
}
