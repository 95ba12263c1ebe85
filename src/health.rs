//! Health and status over HTTP, for Kubernetes probes and for people.
//!
//! - `GET /health/live`: 200 while the pipeline loop's heartbeat is fresh (it beats at least once
//!   a second, even when idle), while a flush is outstanding some sink attempt has ended within
//!   the stall timeout, and the member has not been out of its consumer group for the group stall
//!   timeout while it reaches a broker, and the brokers have not refused the process's Kafka
//!   credentials for the refusal timeout while their file has changed; else 503 — a wedged loop,
//!   a hung flush, a member that stopped joining its group or credentials rotated under the
//!   process (read again by the restart) get the pod restarted; a flush that keeps retrying
//!   through an outage, and a member cut off from every broker, do not.
//! - `GET /health/ready`: 200 once the service is initialised (every sink checked, the consumer
//!   subscribed), every destination's startup check has passed once, and the member has joined
//!   its consumer group, and until it starts shutting down: a rollout replaces the next old pod
//!   only once the new one is in the group, not while it is still waiting for the group to take
//!   it in, and stops at the first pod that cannot reach a destination (a mistyped address, a
//!   network policy: each pod consumed and wrote nothing, ready, and the rollout took the whole
//!   fleet there). A destination that stops answering later is an outage ridden out, not
//!   unreadiness. Holding no partition is not unready: members
//!   beyond the partition count, and every member during a later rebalance, are healthy, and a
//!   readiness that dropped with them would stall rollouts behind the PodDisruptionBudget.
//! - `GET /status`: JSON snapshot — partitions owned, buffer fill, flushes in flight, paused, counters, sinks in an
//!   outage (since when, attempts, last error), the member's place in its group (librdkafka's
//!   group and join states, since when it has been out of it), committed offsets per owned
//!   partition (as confirmed by the broker).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde::Serialize;

/// A heartbeat older than this makes the liveness probe fail.
pub const LIVENESS_STALE_AFTER: Duration = Duration::from_secs(30);

/// Default for how long a flush may go without any sink attempt ending before liveness fails.
pub const DEFAULT_FLUSH_STALL: Duration = Duration::from_secs(300);

/// Processing tasks running this long with none finishing fail liveness: a task on the
/// processing pool hangs (a bug; every input's cost is bounded, `docs/cost-bound.md`, and the
/// largest message takes well under a second). Nothing else shows it: the loop beats, no flush is
/// in flight, and intake stops once the window is full.
pub const PROCESSING_STALL: Duration = Duration::from_secs(300);

/// A member out of its group this long is logged (once per time out of it).
pub const OUT_OF_GROUP_WARNING: Duration = Duration::from_secs(60);

/// Refusals of this process's Kafka credentials, as every Kafka client of the process reports
/// them (`kafka::refusal`). One set of credentials serves every client, so one record serves the
/// process.
pub static KAFKA_REFUSALS: Refusals = Refusals::new();

/// Refusals further apart than this belong to two runs. librdkafka tries a refused connection
/// again at most `reconnect.backoff.max.ms` later (10 s by default, with jitter), each client to
/// each broker, so refusals that go on come well within it.
pub const REFUSAL_GAP: Duration = Duration::from_secs(60);

/// A run of refusals of the credentials, each within [`REFUSAL_GAP`] of the one before.
#[derive(Debug, Default)]
pub struct Refusals(Mutex<Option<RefusalRun>>);

/// The refusals of one run: the first, the last and why (librdkafka's text, which never holds a
/// secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusalRun {
    pub since_ms: u64,
    pub last_ms: u64,
    pub last_reason: String,
}

impl Refusals {
    pub const fn new() -> Refusals {
        Refusals(Mutex::new(None))
    }

    /// A refusal at `now`, for `reason`.
    pub fn record(&self, reason: &str, now: u64) {
        const REASON_CHARS: usize = 512;
        let reason: String = reason.chars().take(REASON_CHARS).collect();
        let mut run = lock(&self.0);
        match &mut *run {
            Some(going) if now.saturating_sub(going.last_ms) <= REFUSAL_GAP.as_millis() as u64 => {
                going.last_ms = going.last_ms.max(now);
                going.last_reason = reason;
            }
            _ => {
                *run = Some(RefusalRun {
                    since_ms: now,
                    last_ms: now,
                    last_reason: reason,
                })
            }
        }
    }

    /// The run still going at `now` (its last refusal within [`REFUSAL_GAP`]), if one is.
    pub fn ongoing(&self, now: u64) -> Option<RefusalRun> {
        lock(&self.0)
            .clone()
            .filter(|run| now.saturating_sub(run.last_ms) <= REFUSAL_GAP.as_millis() as u64)
    }
}

/// A fingerprint of what `file` holds, unless it cannot be read.
fn fingerprint(file: &Path) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let bytes = std::fs::read(file).ok()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    Some(hasher.finish())
}

/// Now, in ms since the Unix epoch: the wall clock as read at the first call, advanced since by
/// the monotonic clock. Every time the probes measure is a difference of two of these, so a step
/// of the wall clock (NTP correcting it after boot, a VM resumed, someone's `date -s`) neither
/// makes a fresh heartbeat look minutes old, failing liveness, nor a stalled one look fresh.
/// `/status` shows them as times; they differ from the wall clock by the steps it took since the
/// process started (its rate adjustments the monotonic clock follows too).
pub(crate) fn now_ms() -> u64 {
    static START: LazyLock<(Instant, u64)> = LazyLock::new(|| (Instant::now(), wall_ms()));
    let (at, wall) = *START;
    wall.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX))
}

/// The wall clock, in ms since the Unix epoch: for times that come from elsewhere
/// (librdkafka's statistics), to be brought into [`now_ms`]'s frame.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the probes and `/status` read, and nothing else: the pipeline and the consumer record
/// each event once (`record_*`, which also sends the event's metric where it has one) and never
/// read it back to decide anything. Lock-free but for the maps.
#[derive(Debug, Default)]
pub struct Status {
    /// Sinks checked and the consumer subscribed.
    initialised: AtomicBool,
    /// Destinations whose startup check has not passed yet (it goes on in the background).
    unchecked: Mutex<BTreeSet<&'static str>>,
    /// The member has been in its consumer group at least once: given an assignment (an empty
    /// one too), or in the group by librdkafka's statistics.
    joined: AtomicBool,
    /// Shutdown requested: draining for the last time.
    stopping: AtomicBool,
    /// Partitions this member owns (a copy: `kafka::ownership` is where they are kept).
    partitions: Mutex<BTreeSet<i32>>,
    /// A drain is running (shutdown or a revoke).
    draining: AtomicBool,
    paused: AtomicBool,
    heartbeat_ms: AtomicU64,
    /// When a sink attempt last ended (or a flush started), for the stall watchdog.
    flush_progress_ms: AtomicU64,
    /// 0: [`DEFAULT_FLUSH_STALL`].
    flush_stall_ms: AtomicU64,
    buffer_messages: AtomicUsize,
    buffer_bytes: AtomicUsize,
    flushes_in_flight: AtomicUsize,
    consumed: AtomicU64,
    invalid: AtomicU64,
    flushed: AtomicU64,
    pauses: AtomicU64,
    rebalances: AtomicU64,
    invalid_by_reason: Mutex<BTreeMap<&'static str, u64>>,
    /// Per sink since start: time spent writing (retries included) and what it wrote.
    sinks: Mutex<BTreeMap<&'static str, SinkTotals>>,
    committed: Mutex<BTreeMap<i32, i64>>,
    /// Sinks whose last attempt failed, by name.
    outages: Mutex<BTreeMap<&'static str, Outage>>,
    /// Sinks whose outage `sink.outage_ms` last showed ([`Status::measure_outages`]).
    outages_measured: Mutex<BTreeSet<&'static str>>,
    /// Writes failing right now (retrying), by sink, over every flush.
    failing_writes: Mutex<BTreeMap<&'static str, usize>>,
    group: Mutex<Membership>,
    /// 0: the member's time out of its group does not fail liveness.
    group_stall_ms: AtomicU64,
    /// 0: refusals of the Kafka credentials do not fail liveness.
    kafka_refused_ms: AtomicU64,
    /// The Kafka credentials' files (password, certificate, key, CA), each with a fingerprint of
    /// what it held when the clients read it.
    credential_files: Mutex<Vec<(PathBuf, u64)>>,
    /// Why liveness failed when last asked (`None`: it passed), so that a change is logged once.
    liveness_failing: Mutex<Option<&'static str>>,
    /// When processing last moved (ms since the Unix epoch: a task finished, or the first began
    /// with none running; 0: none runs), as the window keeps it (`pipeline::window`).
    processing_moved_at: std::sync::OnceLock<Arc<AtomicU64>>,
}

/// The member's place in its consumer group, as librdkafka's statistics last told it (every
/// `statistics.interval.ms`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Membership {
    /// librdkafka's group handler state: `up` once the group coordinator is known and
    /// connected (else `query-coord`, `wait-coord`, `wait-broker`, …); empty before the first
    /// statistics.
    pub state: String,
    /// Where the member is in joining: `steady` once it joined and took its assignment (an empty
    /// one too; with the consumer protocol an idle member stays `init`); `wait-join`,
    /// `wait-sync`, `wait-unassign-call`, … during a rebalance.
    pub join_state: String,
    /// Unix ms since when the member has been out of its group (`kafka::consumer::in_group`),
    /// from its subscription or from the statistics that first saw it out; absent while it is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_since_ms: Option<u64>,
    /// Brokers librdkafka is connected to (state `UP`): none during a Kafka outage or a network
    /// cut, when being out of the group is no fault of the member.
    pub brokers_up: usize,
    /// Since when the member has been out of its group with a broker connected at every
    /// statistics: what liveness measures. A Kafka outage starts it again, so that the rejoin
    /// after a long one is not taken for a member that stopped joining.
    #[serde(skip)]
    connected_out_since_ms: Option<u64>,
    #[serde(skip)]
    warned: bool,
}

/// A sink that is failing: since when, how often, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Outage {
    /// Unix ms of the first failed attempt of this outage.
    pub since_ms: u64,
    pub failed_attempts: u64,
    pub last_error: String,
}

impl Outage {
    /// How long it has lasted at `now` (Unix ms).
    fn lasted(&self, now: u64) -> Duration {
        Duration::from_millis(now.saturating_sub(self.since_ms))
    }
}

/// What one sink did since start.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct SinkTotals {
    pub seconds: f64,
    /// Flushes it wrote (items ÷ writes is its batch size).
    pub writes: u64,
    pub items: u64,
    pub bytes: u64,
}

/// What `/status` shows, at one moment.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub ready: bool,
    pub live: bool,
    pub initialised: bool,
    /// Destinations whose startup check has not passed yet (readiness waits for them).
    pub unchecked: BTreeSet<&'static str>,
    /// The member has joined its consumer group at least once (readiness waits for it).
    pub joined: bool,
    pub stopping: bool,
    pub assigned: bool,
    pub partitions: BTreeSet<i32>,
    pub draining: bool,
    pub paused: bool,
    pub buffer_messages: usize,
    pub buffer_bytes: usize,
    pub flushes_in_flight: usize,
    /// How long processing tasks have been running with none finishing (ms); absent while none
    /// runs (results done and waiting in the window do not count). Liveness fails at
    /// [`PROCESSING_STALL`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processing_still_ms: Option<u64>,
    pub consumed: u64,
    pub invalid: u64,
    pub flushed: u64,
    pub pauses: u64,
    pub rebalances: u64,
    pub invalid_by_reason: BTreeMap<&'static str, u64>,
    pub sinks: BTreeMap<&'static str, SinkTotals>,
    /// Sinks whose last attempt failed.
    pub outages: BTreeMap<&'static str, Outage>,
    pub group: Membership,
    /// The brokers refusing this process's Kafka credentials: since when, the last refusal and
    /// why; absent when no refusal came within the last minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka_refused: Option<RefusalRun>,
    /// While the brokers refuse the credentials: whether a credential file has changed since the
    /// clients read it (liveness fails on the refusals only then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka_credentials_changed: Option<bool>,
    /// Owned partition → next offset to read, as last committed by this process and confirmed by
    /// the broker.
    pub committed: BTreeMap<i32, i64>,
}

impl Status {
    pub fn beat(&self) {
        self.heartbeat_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Whether the liveness probe passes. A change of verdict is logged once: WARN naming the
    /// condition that fails (the kubelet restarts the pod after the probe's failure threshold,
    /// and its event says only "503"), INFO when it passes again.
    pub fn live(&self) -> bool {
        self.live_at(now_ms())
    }

    /// [`Status::live`] at `now` (ms since the Unix epoch).
    pub(crate) fn live_at(&self, now: u64) -> bool {
        let heartbeat = self.heartbeat_ms.load(Ordering::Relaxed);
        if heartbeat == 0 {
            // Not started yet (the first startup check beats): nothing to tell.
            return false;
        }
        let failing = self.failing_liveness(now, heartbeat, &KAFKA_REFUSALS);
        let condition = failing.map(|(what, _)| what);
        let mut told = lock(&self.liveness_failing);
        if *told != condition {
            match failing {
                Some((what, for_ms)) => tracing::warn!(for_ms, "liveness fails: {what}"),
                None => tracing::info!("liveness passes again"),
            }
            *told = condition;
        }
        failing.is_none()
    }

    /// The condition liveness fails on, and for how long it has held (ms).
    fn failing_liveness(
        &self,
        now: u64,
        heartbeat: u64,
        refusals: &Refusals,
    ) -> Option<(&'static str, u64)> {
        let silent = now.saturating_sub(heartbeat);
        if silent >= LIVENESS_STALE_AFTER.as_millis() as u64 {
            return Some(("the pipeline loop stopped beating (wedged)", silent));
        }
        let stall = match self.flush_stall_ms.load(Ordering::Relaxed) {
            0 => DEFAULT_FLUSH_STALL.as_millis() as u64,
            ms => ms,
        };
        let flushing = self.flushes_in_flight.load(Ordering::Relaxed) > 0;
        let still = now.saturating_sub(self.flush_progress_ms.load(Ordering::Relaxed));
        if flushing && still >= stall {
            return Some((
                "a flush has had no sink request end within the flush stall timeout",
                still,
            ));
        }
        if let Some(still) = self
            .processing_still(now)
            .filter(|&still| still >= PROCESSING_STALL.as_millis() as u64)
        {
            return Some((
                "messages have been in processing for the processing stall (5 min) with none finishing: a processing task hangs (a bug; report it); the restart reads them again",
                still,
            ));
        }
        if let Some(refused) = self.refused_too_long(now, refusals) {
            return Some((
                "the brokers have refused this process's Kafka credentials (its login or a certificate) past the Kafka refusal timeout, and a credential file has changed since the clients read it (rotated): the restart reads it again",
                refused,
            ));
        }
        self.out_of_group_too_long(now).map(|out| {
            (
                "out of the consumer group past the group stall timeout, a broker connected",
                out,
            )
        })
    }

    /// How long the member has been out of its group while it reaches a broker, once that is
    /// the group stall timeout or more: librdkafka stopped joining (a rejoin that never came, a
    /// group whose other members use another assignor) and a restart starts it again. Not while
    /// shutting down (the member leaves), nor while no broker answers (a restart would not reach
    /// one either).
    fn out_of_group_too_long(&self, now: u64) -> Option<u64> {
        let stall = self.group_stall_ms.load(Ordering::Relaxed);
        let group = lock(&self.group);
        if stall == 0 || self.stopping.load(Ordering::Relaxed) {
            return None;
        }
        group
            .connected_out_since_ms
            .map(|since| now.saturating_sub(since))
            .filter(|&out| out >= stall)
    }

    /// How long the brokers have refused the Kafka credentials, from the first refusal of the
    /// run going on to its last, once that is the timeout or more: measured between refusals, so
    /// that refusals that stopped (a broker's credentials fixed) never fail liveness after the
    /// fact. Not while shutting down.
    ///
    /// Only once a credential file holds something else than the clients read: then the
    /// restart would log in with it; otherwise it would meet the same refusals (a broker's own
    /// trouble, a password changed on the brokers alone), and a broker restart's cut handshakes
    /// would restart pods that are fine.
    fn refused_too_long(&self, now: u64, refusals: &Refusals) -> Option<u64> {
        let timeout = self.kafka_refused_ms.load(Ordering::Relaxed);
        if timeout == 0 || self.stopping.load(Ordering::Relaxed) {
            return None;
        }
        refusals
            .ongoing(now)
            .map(|run| run.last_ms.saturating_sub(run.since_ms))
            .filter(|&refused| refused >= timeout && self.credentials_changed())
    }

    /// The Kafka credentials' files the clients read at start, to tell a rotation by
    /// ([`Status::credentials_changed`]). Call before the clients are created.
    pub fn watch_credentials(&self, files: Vec<PathBuf>) {
        *lock(&self.credential_files) = files
            .into_iter()
            .filter_map(|file| fingerprint(&file).map(|print| (file, print)))
            .collect();
    }

    /// Whether a credential file holds something else now than when the clients read it (a
    /// rotated Secret the kubelet has updated). A file that cannot be read at the moment (the
    /// kubelet swapping it) is not taken for changed.
    fn credentials_changed(&self) -> bool {
        lock(&self.credential_files)
            .iter()
            .any(|(file, print)| fingerprint(file).is_some_and(|now| now != *print))
    }

    /// How long the brokers may go on refusing the Kafka credentials before liveness fails;
    /// `None`: never.
    pub fn set_kafka_refused_timeout(&self, timeout: Option<Duration>) {
        let ms = timeout.map_or(0, |t| t.as_millis().max(1) as u64);
        self.kafka_refused_ms.store(ms, Ordering::Relaxed);
    }

    /// How long the member may be out of its group, reaching a broker, before liveness fails;
    /// `None`: never.
    pub fn set_group_stall(&self, stall: Option<Duration>) {
        let ms = stall.map_or(0, |s| s.as_millis().max(1) as u64);
        self.group_stall_ms.store(ms, Ordering::Relaxed);
    }

    /// Reads when processing last moved from `moved_at` (ms since the Unix epoch: a group
    /// finished, or the first began with none running; 0: none runs), which the window keeps up
    /// to date.
    pub fn watch_processing(&self, moved_at: Arc<AtomicU64>) {
        let _ = self.processing_moved_at.set(moved_at);
    }

    /// How long processing tasks have been running with none finishing (`None`: none runs).
    fn processing_still(&self, now: u64) -> Option<u64> {
        let moved = self.processing_moved_at.get()?.load(Ordering::Relaxed);
        (moved > 0).then(|| now.saturating_sub(moved))
    }

    /// How long a flush may go without a sink attempt ending before liveness fails.
    pub fn set_flush_stall(&self, stall: Duration) {
        self.flush_stall_ms
            .store(stall.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// A flush started, or a sink attempt ended (either way): the flush is not wedged.
    pub fn flush_progress(&self) {
        self.flush_progress_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// A sink attempt failed: the sink is in an outage (since its first failure). Returns how
    /// long the outage has lasted, whichever flush it began in (`sink.outage_ms`).
    pub fn sink_failed(&self, sink: &'static str, error: &str) -> Duration {
        self.in_outage(sink, error, 1)
    }

    /// One request of a sink attempt failed while the attempt goes on: the outage starts now,
    /// not when the attempt ends (which, for a hung destination, is one timeout per request).
    pub fn sink_request_failed(&self, sink: &'static str, error: &str) {
        self.in_outage(sink, error, 0);
    }

    fn in_outage(&self, sink: &'static str, error: &str, failed_attempts: u64) -> Duration {
        let now = now_ms();
        let mut outages = lock(&self.outages);
        let outage = outages.entry(sink).or_insert_with(|| Outage {
            since_ms: now,
            failed_attempts: 0,
            last_error: String::new(),
        });
        outage.failed_attempts += failed_attempts;
        outage.last_error = error.chars().take(512).collect();
        outage.lasted(now)
    }

    /// Sends `sink.outage_ms` for every sink in an outage (its length so far), and 0 for those
    /// whose outage ended since the last call: the gauge is what `/status` `outages` shows, from
    /// the first failed request on. Set when an attempt ended, it moved once per attempt — 0, then
    /// a timeout and a backoff later about 40 s, then 80 s — against a hung destination, and an
    /// attempt ending on a refusal left it at its last value.
    pub fn measure_outages(&self) {
        let now = now_ms();
        let current: BTreeMap<&'static str, Duration> = lock(&self.outages)
            .iter()
            .map(|(&sink, outage)| (sink, outage.lasted(now)))
            .collect();
        let mut measured = lock(&self.outages_measured);
        for &ended in measured.iter().filter(|s| !current.contains_key(*s)) {
            crate::metrics::sink_outage(ended, Duration::ZERO);
        }
        for (&sink, &lasted) in &current {
            crate::metrics::sink_outage(sink, lasted);
        }
        *measured = current.into_keys().collect();
    }

    /// How long `sink` has been failing, while it is (its last attempt failed).
    pub fn sink_outage(&self, sink: &'static str) -> Option<Duration> {
        lock(&self.outages).get(sink).map(|o| o.lasted(now_ms()))
    }

    /// A write to `sink` started failing (`true`: it retries), or one that was ends (`false`).
    pub fn write_failing(&self, sink: &'static str, failing: bool) {
        let mut writes = lock(&self.failing_writes);
        let count = writes.entry(sink).or_default();
        *count = match failing {
            true => *count + 1,
            false => count.saturating_sub(1),
        };
    }

    /// Whether any write to `sink` is failing, in any flush.
    pub fn writes_failing(&self, sink: &'static str) -> bool {
        lock(&self.failing_writes)
            .get(sink)
            .is_some_and(|&count| count > 0)
    }

    /// A sink attempt succeeded: its outage, if any, is over. Returns how long it lasted.
    pub fn sink_recovered(&self, sink: &'static str) -> Option<Duration> {
        lock(&self.outages).remove(sink).map(|o| o.lasted(now_ms()))
    }

    pub fn ready(&self) -> bool {
        self.initialised.load(Ordering::Relaxed)
            && lock(&self.unchecked).is_empty()
            && self.joined.load(Ordering::Relaxed)
            && !self.stopping.load(Ordering::Relaxed)
    }

    // What the pipeline and the consumer record: one call each, which updates what `/status`
    // shows and sends the event's metric.

    /// `destination`'s startup check did not pass at start and goes on in the background
    /// (`checked` false: the member is not ready until it passes), or it passed since (`true`).
    pub fn record_startup_check(&self, destination: &'static str, checked: bool) {
        let mut unchecked = lock(&self.unchecked);
        if checked {
            unchecked.remove(destination);
        } else {
            unchecked.insert(destination);
        }
    }

    /// Every sink checked and the consumer subscribed: ready once the member joins its group
    /// ([`Status::record_joined`]), and, if the member has
    /// `statistics`, out of the group until they say it joined (without them `/status` says
    /// nothing of the group rather than out of it since the start). Without statistics, a member
    /// of the `consumer_protocol` (KIP-848) left without a partition has nothing telling it joined
    /// (librdkafka calls no callback for its empty assignment): it is ready from now, without
    /// waiting for a join nothing would report.
    pub fn record_initialised(&self, statistics: bool, consumer_protocol: bool) {
        self.initialised.store(true, Ordering::Relaxed);
        if statistics {
            lock(&self.group).out_since_ms.get_or_insert(now_ms());
        } else if consumer_protocol {
            self.joined.store(true, Ordering::Relaxed);
        }
    }

    /// librdkafka's statistics of the member's group: its `state` and `join_state`, whether they
    /// say it is `in_group` now, and how many brokers it is connected to. Logs a member out of its
    /// group for [`OUT_OF_GROUP_WARNING`] (once) and its return, and sends
    /// `consumer.out_of_group_ms` and `consumer.out_of_group_connected_ms`.
    pub fn record_group(&self, state: &str, join_state: &str, in_group: bool, brokers_up: usize) {
        let now = now_ms();
        let mut group = lock(&self.group);
        group.state.clear();
        group.state.push_str(state);
        group.join_state.clear();
        group.join_state.push_str(join_state);
        group.brokers_up = brokers_up;
        let (out_ms, connected_out_ms) = if in_group {
            self.record_joined();
            group.connected_out_since_ms = None;
            if let Some(since) = group.out_since_ms.take()
                && std::mem::take(&mut group.warned)
            {
                tracing::info!(
                    out_ms = now.saturating_sub(since),
                    "the member is back in its consumer group"
                );
            }
            (0, 0)
        } else {
            group.connected_out_since_ms =
                (brokers_up > 0).then(|| group.connected_out_since_ms.unwrap_or(now));
            let out_ms = now.saturating_sub(*group.out_since_ms.get_or_insert(now));
            if out_ms >= OUT_OF_GROUP_WARNING.as_millis() as u64 && !group.warned {
                group.warned = true;
                tracing::warn!(
                    out_ms,
                    state,
                    join_state,
                    brokers_up,
                    "the member has been out of its consumer group for a minute: it consumes nothing meanwhile (/status `group`)"
                );
            }
            let connected = group.connected_out_since_ms.map(|s| now.saturating_sub(s));
            (out_ms, connected.unwrap_or(0))
        };
        crate::metrics::out_of_group(out_ms, connected_out_ms);
    }

    /// The member joined its consumer group (an assignment callback, an empty assignment too, or
    /// statistics saying it is in the group): ready from now on, through later rebalances and
    /// outages, until shutdown. The first time is logged.
    pub fn record_joined(&self) {
        if !self.joined.swap(true, Ordering::Relaxed) {
            tracing::info!("joined the consumer group: ready");
        }
    }

    /// Shutdown requested: not ready from now on.
    pub fn record_stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// A drain (shutdown or a revoke) started or ended.
    pub fn record_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::Relaxed);
    }

    /// The partitions this member owns after a rebalance callback. The committed offsets of
    /// partitions given away are dropped: their next owner commits them, and an offset this
    /// member committed long ago would read as its own progress.
    pub fn record_partitions(&self, owned: BTreeSet<i32>) {
        lock(&self.committed).retain(|p, _| owned.contains(p));
        *lock(&self.partitions) = owned;
    }

    /// `flushes` flushes are running on the blocking pool.
    pub fn record_flushes_in_flight(&self, flushes: usize) {
        self.flushes_in_flight.store(flushes, Ordering::Relaxed);
    }

    /// A message was taken from the consumer.
    pub fn record_consumed(&self, messages: usize) {
        self.consumed.fetch_add(messages as u64, Ordering::Relaxed);
        crate::metrics::consumed(messages);
    }

    /// The buffer holds `messages` of `bytes`.
    pub fn record_buffer(&self, messages: usize, bytes: usize) {
        self.buffer_messages.store(messages, Ordering::Relaxed);
        self.buffer_bytes.store(bytes, Ordering::Relaxed);
        crate::metrics::buffer(messages, bytes);
    }

    /// Intake paused behind a full buffer.
    pub fn record_paused(&self) {
        self.pauses.fetch_add(1, Ordering::Relaxed);
        self.paused.store(true, Ordering::Relaxed);
    }

    /// Intake resumed.
    pub fn record_resumed(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    /// The broker confirmed a commit of `positions`: those of partitions this member still owns
    /// are shown (a revoke's drain commits partitions the callback already gave away).
    pub fn record_commit(&self, positions: impl IntoIterator<Item = (i32, i64)>) {
        let owned = lock(&self.partitions);
        lock(&self.committed).extend(positions.into_iter().filter(|(p, _)| owned.contains(p)));
        crate::metrics::committed();
    }

    /// A revoke was handled.
    pub fn record_rebalance(&self) {
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        crate::metrics::rebalanced();
    }

    /// A flush is durable: `messages` of its messages are committed by this member; the batch's
    /// counts and each sink's timings and volumes go to the metrics (`metrics::flushed`).
    pub fn record_flushed(
        &self,
        messages: u64,
        close_reason: &'static str,
        valid: u64,
        invalid_by_reason: impl Iterator<Item = (&'static str, u64)>,
        sinks: impl Iterator<Item = (&'static str, Duration, u64, u64)>,
    ) {
        self.flushed.fetch_add(messages, Ordering::Relaxed);
        crate::metrics::flushed(close_reason, valid, invalid_by_reason, sinks);
    }

    pub fn record_invalid(&self, reason: &'static str) {
        self.invalid.fetch_add(1, Ordering::Relaxed);
        *lock(&self.invalid_by_reason).entry(reason).or_default() += 1;
    }

    /// What `sink` wrote in one flush: `items` items of `bytes` bytes in `took`.
    pub fn record_sink(
        &self,
        sink: &'static str,
        took: std::time::Duration,
        items: u64,
        bytes: u64,
    ) {
        let mut sinks = lock(&self.sinks);
        let totals = sinks.entry(sink).or_default();
        totals.seconds += took.as_secs_f64();
        totals.writes += 1;
        totals.items += items;
        totals.bytes += bytes;
    }

    /// What `/status` shows.
    pub fn report(&self) -> serde_json::Value {
        serde_json::to_value(self.snapshot()).unwrap_or_default()
    }

    pub fn snapshot(&self) -> Snapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let partitions = lock(&self.partitions).clone();
        let kafka_refused = KAFKA_REFUSALS.ongoing(now_ms());
        let kafka_credentials_changed = kafka_refused.as_ref().map(|_| self.credentials_changed());
        Snapshot {
            ready: self.ready(),
            live: self.live(),
            initialised: self.initialised.load(Ordering::Relaxed),
            unchecked: lock(&self.unchecked).clone(),
            joined: self.joined.load(Ordering::Relaxed),
            stopping: self.stopping.load(Ordering::Relaxed),
            assigned: !partitions.is_empty(),
            partitions,
            draining: self.draining.load(Ordering::Relaxed),
            paused: self.paused.load(Ordering::Relaxed),
            buffer_messages: self.buffer_messages.load(Ordering::Relaxed),
            buffer_bytes: self.buffer_bytes.load(Ordering::Relaxed),
            flushes_in_flight: self.flushes_in_flight.load(Ordering::Relaxed),
            processing_still_ms: self.processing_still(now_ms()),
            consumed: load(&self.consumed),
            invalid: load(&self.invalid),
            flushed: load(&self.flushed),
            pauses: load(&self.pauses),
            rebalances: load(&self.rebalances),
            invalid_by_reason: lock(&self.invalid_by_reason).clone(),
            sinks: lock(&self.sinks).clone(),
            outages: lock(&self.outages).clone(),
            group: lock(&self.group).clone(),
            kafka_refused,
            kafka_credentials_changed,
            committed: lock(&self.committed).clone(),
        }
    }
}

/// The maps hold plain counters: a panic elsewhere cannot leave them inconsistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn code(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

pub fn router(status: Arc<Status>) -> Router {
    Router::new()
        .route(
            "/health/live",
            get(|State(s): State<Arc<Status>>| async move { code(s.live()) }),
        )
        .route(
            "/health/ready",
            get(|State(s): State<Arc<Status>>| async move { code(s.ready()) }),
        )
        .route(
            "/status",
            get(|State(s): State<Arc<Status>>| async move { axum::Json(s.report()) }),
        )
        .with_state(status)
}

/// Connections the probe server holds at most. Probes open one connection each and close it
/// (the kubelet sends `Connection: close`), so a handful is ever in use; past this, accepting one
/// closes the oldest — which, under a flood of idle sockets, is one of the flood's.
pub const MAX_PROBE_CONNECTIONS: usize = 128;

/// How long a client may take to send a request's headers before its connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest a probe connection lives, whatever it does (a slow reader of `/status` too).
pub const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// The probe server's open connections, oldest first, each with what closes it.
#[derive(Default)]
struct Connections {
    next_id: u64,
    open: std::collections::VecDeque<(u64, tokio::sync::oneshot::Sender<()>)>,
}

impl Connections {
    /// Registers a new connection; when at the cap, the oldest is told to close.
    fn open(&mut self, close: tokio::sync::oneshot::Sender<()>) -> u64 {
        if self.open.len() >= MAX_PROBE_CONNECTIONS
            && let Some((_, oldest)) = self.open.pop_front()
        {
            let _ = oldest.send(());
        }
        self.next_id += 1;
        self.open.push_back((self.next_id, close));
        self.next_id
    }

    fn closed(&mut self, id: u64) {
        self.open.retain(|(open, _)| *open != id);
    }
}

/// [`Status::measure_outages`] every second, for good (a tick missed under load is skipped, not
/// made up by a burst that reads the same state).
pub async fn measure_outages(status: Arc<Status>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        status.measure_outages();
    }
}

/// Serves the endpoints on `listener` until the process exits. Nothing a client does can take
/// file descriptors from the sinks or keep the probes from answering: at most
/// [`MAX_PROBE_CONNECTIONS`] connections are held (the oldest closed first), a request's headers
/// must arrive within [`HEADER_READ_TIMEOUT`], a connection lives at most
/// [`MAX_CONNECTION_LIFETIME`], and a failed accept (out of descriptors) is waited out.
pub async fn serve(listener: tokio::net::TcpListener, status: Arc<Status>) -> std::io::Result<()> {
    let app = router(status);
    let connections = Arc::new(Mutex::new(Connections::default()));
    for accepted in 1u64.. {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, most often: the probes then time out, and the restart
                // they lead to is explained here (throttled: tried every 20 ms).
                if let Some(held_back) = crate::logs::ACCEPT_FAILED.admit() {
                    tracing::warn!(%error, held_back, "probe server: accept failed");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let (close, closed) = tokio::sync::oneshot::channel();
        let id = lock(&connections).open(close);
        let (app, connections) = (app.clone(), connections.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    tower_service::Service::call(&mut app.clone(), request)
                },
            );
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(false)
                .max_buf_size(64 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = closed => {}
                _ = tokio::time::sleep(MAX_CONNECTION_LIFETIME) => {}
            }
            lock(&connections).closed(id);
        });
        // Under a flood accepts are always ready: let the connections just accepted be read (a
        // probe's request is already in its socket) long before more accepts make them the
        // oldest, while accepting fast enough to keep the listen queue from filling.
        if accepted % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// The probe port's listener, with a listen queue as long as the kernel allows (tokio's default
/// is 1 024), so that a burst of connections does not leave a probe's SYN unanswered.
pub fn listen(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(65_535)
}

/// The container's memory limit (cgroup v2 `memory.max`, else v1 `memory.limit_in_bytes`), when
/// there is one.
pub fn container_memory_limit() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok())
    .and_then(|text| memory_limit(&text))
}

/// A cgroup's memory limit as its file says it: `max` (v2) or a number near `i64::MAX`, rounded
/// to the page (v1), is none.
fn memory_limit(text: &str) -> Option<u64> {
    const UNLIMITED_FROM: u64 = 1 << 62;
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&bytes| bytes < UNLIMITED_FROM)
}

/// Raises the soft limit on open file descriptors to the hard limit, and returns both. A
/// container's soft limit is often 1 024 while its hard limit is far higher; the sinks' connection
/// pools, the Kafka clients and the probe server all draw on it, and nothing is gained by running
/// out early.
pub fn raise_fd_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the duration of each call.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = limit.rlim_max;
        }
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sink.outage_ms` by sink after `measure` (on this thread's recorder).
    fn outage_gauges(measure: impl FnOnce()) -> BTreeMap<String, f64> {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, measure);
        let snapshot = recorder.snapshotter().snapshot().into_vec();
        snapshot
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Gauge(v) if key.key().name() == crate::metrics::SINK_OUTAGE_MS => {
                    let sink = key.key().labels().next()?.value().to_owned();
                    Some((sink, v.into_inner()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_outage_gauge_is_what_status_shows_from_the_first_failed_request_and_0_once_over() {
        let s = Status::default();
        s.sink_request_failed("gcs", "timed out");
        let gauges = outage_gauges(|| s.measure_outages());
        assert!(
            gauges.keys().eq(["gcs"]),
            "an attempt still under way: {gauges:?}"
        );
        s.sink_recovered("gcs");
        s.sink_failed("clickhouse", "answered 503");
        let gauges = outage_gauges(|| s.measure_outages());
        assert_eq!(gauges.get("gcs"), Some(&0.0), "over: {gauges:?}");
        assert!(gauges.contains_key("clickhouse"), "{gauges:?}");
        let gauges = outage_gauges(|| s.measure_outages());
        assert!(
            gauges.keys().eq(["clickhouse"]),
            "0 sent once for an outage over: {gauges:?}"
        );
    }

    /// The probes' clock reads as the wall clock (no step taken during the tests), advances with
    /// time and never goes back.
    #[test]
    fn the_probes_clock_reads_as_the_wall_clock_and_never_goes_back() {
        let first = now_ms();
        assert!(
            first.abs_diff(wall_ms()) < 1000,
            "{first} against {}",
            wall_ms()
        );
        let mut last = first;
        for _ in 0..10_000 {
            let now = now_ms();
            assert!(now >= last, "{now} after {last}");
            last = now;
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(now_ms() >= first + 20);
    }

    /// The probe server on a port of its own, with a default status.
    async fn probe_server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(Status::default())));
        address
    }

    /// Everything the server sends on `stream` until it closes the connection.
    async fn until_closed(stream: &mut tokio::net::TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// A client that sends part of its headers and stops (one of a flood) is closed once
    /// `HEADER_READ_TIMEOUT` has passed, not held for ever. (Time is the runtime's, paused.)
    #[tokio::test(start_paused = true)]
    async fn headers_that_do_not_arrive_in_time_end_the_connection() {
        use tokio::io::AsyncWriteExt;
        let address = probe_server().await;
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let answer = until_closed(&mut stream).await;
        assert!(
            started.elapsed() >= HEADER_READ_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert!(
            started.elapsed() < MAX_CONNECTION_LIFETIME,
            "{:?}",
            started.elapsed()
        );
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer}"
        );
    }

    /// One request per connection: the answer says so and the connection closes, though the
    /// client asked to keep it (a prober that kept connections would hold the server's few).
    #[tokio::test]
    async fn a_connection_serves_one_request_and_closes() {
        use tokio::io::AsyncWriteExt;
        let address = probe_server().await;
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n";
        stream.write_all(request).await.unwrap();
        let answer = until_closed(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
        assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    }

    #[test]
    fn past_the_cap_the_oldest_connection_is_closed() {
        let mut connections = Connections::default();
        let mut receivers = Vec::new();
        for _ in 0..MAX_PROBE_CONNECTIONS + 2 {
            let (close, closed) = tokio::sync::oneshot::channel();
            connections.open(close);
            receivers.push(closed);
        }
        assert_eq!(connections.open.len(), MAX_PROBE_CONNECTIONS);
        let told: Vec<bool> = receivers.iter_mut().map(|r| r.try_recv().is_ok()).collect();
        assert_eq!(told.iter().filter(|t| **t).count(), 2);
        assert!(told[0] && told[1], "the two oldest");
        connections.closed(3);
        assert_eq!(connections.open.len(), MAX_PROBE_CONNECTIONS - 1);
    }

    #[test]
    fn committed_offsets_of_a_partition_given_away_leave_the_status() {
        let s = Status::default();
        s.record_partitions(BTreeSet::from([0, 1, 2]));
        s.record_commit([(0, 10), (1, 20), (2, 30)]);
        s.record_partitions(BTreeSet::from([1, 3]));
        assert_eq!(s.snapshot().committed, BTreeMap::from([(1, 20)]));
        s.record_partitions(BTreeSet::from([0, 1, 3]));
        s.record_commit([(0, 11)]);
        assert_eq!(s.snapshot().committed, BTreeMap::from([(0, 11), (1, 20)]));
        // A revoke's drain commits what the callback already gave away.
        s.record_partitions(BTreeSet::from([1, 3]));
        s.record_commit([(0, 12), (1, 21)]);
        assert_eq!(s.snapshot().committed, BTreeMap::from([(1, 21)]));
    }

    #[test]
    fn not_ready_until_every_startup_check_passed_and_ready_through_a_later_outage() {
        let s = Status::default();
        s.record_startup_check("clickhouse", false);
        s.record_startup_check("gcs", false);
        s.record_initialised(false, false);
        s.record_joined();
        assert!(!s.ready(), "two destinations not reached yet");
        assert_eq!(
            s.report()["unchecked"],
            serde_json::json!(["clickhouse", "gcs"])
        );
        s.record_startup_check("gcs", true);
        assert!(!s.ready(), "ClickHouse not reached yet");
        s.record_startup_check("clickhouse", true);
        assert!(s.ready());
        assert_eq!(s.report()["unchecked"], serde_json::json!([]));
        s.sink_failed("clickhouse", "answered 503");
        assert!(s.ready(), "an outage after the checks is ridden out, ready");
    }

    #[test]
    fn ready_from_the_first_join_until_shutdown_whatever_the_assignment() {
        let s = Status::default();
        assert!(!s.ready(), "sinks not checked yet");
        s.record_initialised(true, false);
        assert!(!s.ready(), "not in its group yet");
        s.record_group("up", "wait-join", false, 1);
        assert!(!s.ready(), "still joining");
        s.record_joined();
        assert!(s.ready(), "an idle member (no partitions) is ready");
        s.record_group("up", "wait-join", false, 1);
        assert!(s.ready(), "a later rebalance is not unreadiness");
        s.record_draining(true);
        assert!(
            s.ready(),
            "a revoke's drain during a rebalance is not unreadiness"
        );
        s.record_stopping();
        assert!(!s.ready());
        let by_statistics = Status::default();
        by_statistics.record_initialised(true, false);
        by_statistics.record_group("up", "steady", true, 1);
        assert!(by_statistics.ready(), "the statistics say it joined");
        let classic = Status::default();
        classic.record_initialised(false, false);
        assert!(!classic.ready(), "its assignment callback will say it");
        let untold = Status::default();
        untold.record_initialised(false, true);
        assert!(untold.ready(), "nothing would say it joined");
    }

    #[test]
    fn a_member_without_statistics_is_not_said_out_of_its_group_nor_restarted() {
        let s = Status::default();
        s.beat();
        s.set_group_stall(Some(Duration::from_millis(1)));
        s.record_initialised(false, false);
        std::thread::sleep(Duration::from_millis(5));
        assert!(s.live());
        assert_eq!(s.snapshot().group.out_since_ms, None);
        let with = Status::default();
        with.record_initialised(true, false);
        assert!(
            with.snapshot().group.out_since_ms.is_some(),
            "until they say"
        );
    }

    /// A live status whose member is out of its group past a 50 ms group stall: `record`
    /// receives it to record statistics before and after the stall.
    fn out_of_group(record: impl Fn(&Status, bool)) -> Status {
        out_of_group_at(record).0
    }

    /// [`out_of_group`], and the instant (ms) just before the second record: whatever that
    /// record starts counting has not lasted at all then, however loaded the machine.
    fn out_of_group_at(record: impl Fn(&Status, bool)) -> (Status, u64) {
        let s = Status::default();
        s.beat();
        s.set_group_stall(Some(Duration::from_millis(50)));
        s.record_initialised(true, false);
        record(&s, false);
        std::thread::sleep(Duration::from_millis(60));
        let at = now_ms();
        record(&s, true);
        (s, at)
    }

    #[test]
    fn out_of_the_group_past_the_group_stall_with_a_broker_connected_is_not_live() {
        let s = out_of_group(|s, _| s.record_group("up", "wait-join", false, 1));
        assert!(!s.live(), "joining for longer than the group stall");
        let group = s.snapshot().group;
        assert_eq!(
            (group.state.as_str(), group.join_state.as_str()),
            ("up", "wait-join")
        );
        assert!(group.out_since_ms.is_some());
        s.record_group("up", "steady", true, 1);
        assert!(s.live(), "back in the group");
        assert_eq!(s.snapshot().group.out_since_ms, None);
    }

    #[test]
    fn refusals_within_a_minute_of_each_other_are_one_run() {
        let refusals = Refusals::new();
        assert_eq!(refusals.ongoing(1_000), None);
        for at in [1_000, 40_000, 100_000] {
            refusals.record("SASL authentication error", at);
        }
        let run = refusals
            .ongoing(150_000)
            .expect("the last refusal is 50 s old");
        assert_eq!((run.since_ms, run.last_ms), (1_000, 100_000));
        assert_eq!(
            refusals.ongoing(160_001),
            None,
            "over a minute since the last"
        );
        refusals.record("certificate verify failed", 200_000);
        let run = refusals.ongoing(200_000).unwrap();
        assert_eq!(
            (run.since_ms, run.last_reason.as_str()),
            (200_000, "certificate verify failed"),
            "a new run"
        );
    }

    #[test]
    fn refusals_going_on_past_the_timeout_fail_liveness_and_refusals_that_stopped_never_do() {
        let s = Status::default();
        let refusals = Refusals::new();
        let now = now_ms();
        let failing = |now: u64| {
            s.failing_liveness(now, now, &refusals)
                .map(|(what, _)| what)
        };
        for at in (0..=3).map(|i| now + i * 1_000) {
            refusals.record("Authentication failed", at);
        }
        assert_eq!(failing(now + 3_000), None, "no timeout set: never");
        s.set_kafka_refused_timeout(Some(Duration::from_secs(3)));
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "before\n").unwrap();
        s.watch_credentials(vec![password.clone(), dir.path().join("not-mounted")]);
        assert_eq!(
            failing(now + 3_000),
            None,
            "the files unchanged: a restart would be refused too"
        );
        std::fs::write(&password, "rotated\n").unwrap();
        let condition = failing(now + 3_000).expect("refused for 3 s, the password rotated");
        assert!(condition.contains("refused this process's Kafka credentials"));
        // Refusals that stopped 2 s in are a run of 2 s, whenever liveness is asked.
        let stopped = Refusals::new();
        for at in [now, now + 2_000] {
            stopped.record("Authentication failed", at);
        }
        assert_eq!(
            s.failing_liveness(now + 30_000, now + 30_000, &stopped),
            None
        );
        s.record_stopping();
        assert_eq!(failing(now + 3_000), None, "not while shutting down");
    }

    #[test]
    fn a_member_in_its_group_or_without_a_group_stall_is_live() {
        let s = out_of_group(|s, _| s.record_group("up", "steady", true, 1));
        assert!(s.live(), "in the group (an empty assignment too)");
        let s = out_of_group(|s, _| s.record_group("up", "wait-join", false, 1));
        s.set_group_stall(None);
        assert!(s.live(), "the check turned off");
        let s = out_of_group(|s, _| s.record_group("up", "wait-join", false, 1));
        s.record_stopping();
        assert!(s.live(), "a member shutting down leaves its group");
    }

    #[test]
    fn time_out_of_the_group_without_a_broker_does_not_count_toward_the_stall() {
        // Out of the group throughout, no broker connected until the stall has passed.
        let (s, at) = out_of_group_at(|s, after| {
            s.record_group("query-coord", "init", false, usize::from(after))
        });
        assert!(
            s.live_at(at),
            "a Kafka outage ended a moment ago: its length is not the member's fault"
        );
        std::thread::sleep(Duration::from_millis(60));
        s.record_group("up", "wait-join", false, 1);
        assert!(!s.live(), "connected and still out past the stall");
        s.record_group("wait-coord", "init", false, 0);
        assert!(s.live(), "the brokers gone again");
        assert!(
            s.snapshot().group.out_since_ms.is_some(),
            "/status shows the whole time out"
        );
    }

    #[test]
    fn a_cgroups_memory_limit_is_read_as_it_writes_it() {
        assert_eq!(memory_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(memory_limit("max\n"), None, "v2: none");
        assert_eq!(memory_limit("9223372036854771712\n"), None, "v1: none");
        assert_eq!(memory_limit(""), None);
    }

    #[test]
    fn live_needs_a_recent_heartbeat() {
        let s = Status::default();
        assert!(!s.live());
        s.beat();
        assert!(s.live());
    }

    /// Messages in processing with none finishing for the processing stall: a task that hangs,
    /// which nothing else shows (the loop beats, no flush is in flight).
    #[test]
    fn processing_that_does_not_move_for_the_stall_fails_liveness() {
        let s = Status::default();
        let moved_at = Arc::new(AtomicU64::new(0));
        s.watch_processing(moved_at.clone());
        let start = now_ms();
        s.beat();
        let stall = PROCESSING_STALL.as_millis() as u64;
        let failing = |at: u64| s.failing_liveness(at, at, &Refusals::default());
        assert_eq!(failing(start + stall), None, "an empty window");
        moved_at.store(start, Ordering::Relaxed);
        assert_eq!(failing(start + stall - 1), None);
        let (what, for_ms) = failing(start + stall).expect("a hung task");
        assert!(what.contains("processing task hangs"), "{what}");
        assert_eq!(for_ms, stall);
        assert_eq!(
            s.snapshot().processing_still_ms.map(|ms| ms < stall),
            Some(true)
        );
        // A group finishes: it moved.
        moved_at.store(start + stall, Ordering::Relaxed);
        assert_eq!(failing(start + stall + 1), None);
    }

    /// A liveness probe that fails says why, once: the kubelet's event says only "503", and the
    /// restart it leads to left no trace of the cause.
    #[test]
    fn liveness_failing_is_logged_once_naming_the_condition_and_its_end_once() {
        let s = Status::default();
        s.beat();
        s.set_flush_stall(Duration::from_secs(10));
        s.record_flushes_in_flight(1);
        s.flush_progress();
        // At times of the test's choosing: a loaded machine does not move them.
        let start = now_ms();
        let (_, lines) = crate::logs::captured(|| {
            assert!(s.live_at(start));
            for _ in 0..5 {
                assert!(!s.live_at(start + 10_000), "a flush without progress");
            }
            // A sink request ends: the stall counts from it.
            s.flush_progress();
            assert!(s.live_at(start + 9_000));
            assert!(s.live_at(start + 9_500));
        });
        let said: Vec<(&str, &str)> = lines
            .iter()
            .map(|l| (l["level"].as_str().unwrap(), l["message"].as_str().unwrap()))
            .collect();
        assert_eq!(
            said,
            [
                (
                    "WARN",
                    "liveness fails: a flush has had no sink request end within the flush stall timeout"
                ),
                ("INFO", "liveness passes again"),
            ]
        );
        assert!(
            lines[0]["for_ms"].as_u64().unwrap() >= 10_000,
            "{}",
            lines[0]
        );
    }

    #[test]
    fn a_flush_without_progress_past_the_stall_timeout_is_not_live_and_a_retrying_one_is() {
        // At times of the test's choosing, each just after the event it follows: a loaded
        // machine does not move them.
        const STALL: u64 = 10_000;
        let s = Status::default();
        s.beat();
        s.set_flush_stall(Duration::from_millis(STALL));
        s.record_flushes_in_flight(1);
        let progressed = now_ms();
        s.flush_progress();
        assert!(s.live_at(progressed), "a flush that just made progress");
        assert!(
            !s.live_at(progressed + STALL + 1_000),
            "no sink attempt ended within the stall timeout"
        );
        s.sink_failed("gcs", "503");
        let progressed = now_ms();
        s.flush_progress();
        assert!(
            s.live_at(progressed),
            "a failed attempt is progress: retrying is not wedged"
        );
        s.record_flushes_in_flight(0);
        assert!(
            s.live_at(progressed + STALL + 1_000),
            "no flush outstanding, nothing to stall"
        );
    }

    /// `sink.outage_ms` is the outage's length, from its first failure, whichever flush it
    /// began in: each flush set it to its own write's length, so with two flushes in flight the
    /// gauge went back and forth.
    #[test]
    fn an_outage_lasts_from_its_first_failure_whichever_write_reports_it() {
        let s = Status::default();
        s.sink_request_failed("gcs", "503");
        std::thread::sleep(Duration::from_millis(1000));
        let first = s.sink_failed("gcs", "503");
        assert!(first >= Duration::from_millis(1000), "{first:?}");
        s.sink_recovered("gcs");
        // Shorter than the first: a loaded machine does not spend a second between two lines.
        let second = s.sink_failed("gcs", "503");
        assert!(second < first, "a new outage: {second:?}");
    }

    #[test]
    fn an_outage_is_reported_from_its_first_failure_until_a_success() {
        let s = Status::default();
        s.sink_failed("clickhouse", "connection refused");
        s.sink_failed("clickhouse", "Code: 210");
        let snapshot = s.snapshot();
        let outage = &snapshot.outages["clickhouse"];
        assert_eq!(
            (outage.failed_attempts, outage.last_error.as_str()),
            (2, "Code: 210")
        );
        assert!(s.sink_recovered("clickhouse").is_some());
        assert!(s.snapshot().outages.is_empty());
    }
}
