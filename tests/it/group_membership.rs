//! The member's place in its consumer group, from librdkafka's statistics: `/status` `group`, the
//! `consumer.out_of_group_ms` gauge, and liveness once the member has been out of its group past
//! `--group-stall-timeout-ms` while it reaches a broker, and readiness, which waits for the
//! member's first join. On the real broker: idle members (more members than partitions) are in
//! their group under both group protocols, ready, and stay live, with statistics or without; a
//! member its group keeps out (another member of the group uses an assignor it does not share)
//! is never ready and fails liveness, and is live and ready once it joins; a member cut off from
//! every broker by an outage longer than the stall stays live, and so does its rejoin afterwards.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::*;

/// The group stall of these tests; the members' `max.poll.interval.ms` (4 s), drain deadline
/// (1.5 s) and `reconnect.backoff.max.ms` (1 s) together, which it must exceed. librdkafka's 10 s
/// backoff would not fit: after the broker's restart the member's connection to its coordinator
/// waited it out (4–9 s measured) while the bootstrap connection was up, and liveness failed.
const GROUP_STALL: Duration = Duration::from_secs(8);

/// A one-partition topic, its dead-letter topic, a group id and a blob directory: one test's, on
/// the brokers it names.
struct OnePartition {
    brokers: String,
    topic: String,
    dlq: String,
    group: String,
    dir: tempfile::TempDir,
}

impl OnePartition {
    async fn create(prefix: &str) -> OnePartition {
        Self::create_on(&kafka(), prefix).await
    }

    /// [`OnePartition::create`] on the cluster `base` points at.
    async fn create_on(base: &rdkafka::ClientConfig, prefix: &str) -> OnePartition {
        let (topic, dlq, group) = (unique(prefix), unique("dlq"), unique("group"));
        create_topic_on(base, &topic, 1).await;
        create_topic_on(base, &dlq, 1).await;
        let dir = tempfile::tempdir().unwrap();
        OnePartition {
            brokers: base.get("bootstrap.servers").unwrap().to_owned(),
            topic,
            dlq,
            group,
            dir,
        }
    }

    /// A member of the group: the service with local sinks, statistics every 500 ms, the group
    /// stall above, `extra` flags, and metrics to a port of its own (returned beside it).
    fn member(&self, extra: &[&str]) -> (Service, Statsd) {
        let statsd = Statsd::bind();
        let args = with_flag(
            service_args(
                &self.topic,
                &self.dlq,
                &self.group,
                self.dir.path(),
                free_port(),
            ),
            "--statsd-address",
            &format!("127.0.0.1:{}", statsd.port()),
        );
        let mut args = with_flag(args, "--brokers", &self.brokers);
        args.extend(
            [
                "--statsd-flush-interval-ms",
                "100",
                "--group-stall-timeout-ms",
                &GROUP_STALL.as_millis().to_string(),
                "--kafka-property",
                "statistics.interval.ms=500",
                "--kafka-property",
                "max.poll.interval.ms=4000",
                "--kafka-property",
                "reconnect.backoff.max.ms=1000",
            ]
            .map(String::from),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        (Service::start(&args), statsd)
    }
}

/// `/status` `group` of `service`, or `null` while the endpoint is not up.
fn group(service: &Service) -> serde_json::Value {
    service
        .status()
        .map_or(serde_json::Value::Null, |s| s["group"].clone())
}

/// What `/status` says of a member in its group: coordinator connected, not out since anything
/// (its join state is `steady`, or `init` for an idle member of the consumer protocol).
fn in_group(group: &serde_json::Value) -> bool {
    group["state"] == "up" && group.get("out_since_ms").is_none()
}

/// The values `consumer.out_of_group_ms` had in what `statsd` received.
fn out_of_group_ms(statsd: &Statsd) -> Vec<f64> {
    out_of_group(statsd).0
}

/// The values `consumer.out_of_group_ms` and `consumer.out_of_group_connected_ms` had in what
/// `statsd` received.
fn out_of_group(statsd: &Statsd) -> (Vec<f64>, Vec<f64>) {
    let mut values = statsd.read_now().values;
    let mut gauge = |name: &str| values.remove(name).unwrap_or_default();
    (
        gauge("replay_ingest.consumer.out_of_group_ms"),
        gauge("replay_ingest.consumer.out_of_group_connected_ms"),
    )
}

/// Two members of `setup`'s group with `flags`, once one owns the partition and both are ready
/// (and, with `statistics`, in their group by them).
async fn two_members_settled(
    setup: &OnePartition,
    flags: &[&str],
    statistics: bool,
) -> [(Service, Statsd); 2] {
    let members = [setup.member(flags), setup.member(flags)];
    wait_for(
        "one member owning the partition, both in the group and ready",
        JOIN_AND_FLUSH,
        || {
            members.iter().map(|(m, _)| m.owned()).sum::<usize>() == 1
                && members.iter().all(|(m, _)| {
                    (!statistics || in_group(&group(m))) && m.probe("/health/ready") == Some(200)
                })
        },
    )
    .await;
    members
}

/// Two members on a one-partition topic: once the group settled, both are in it — the one
/// without a partition too — and both stay live for longer than the group stall.
async fn idle_member_stays_in_its_group(protocol: &[&str]) {
    let setup = OnePartition::create("idle").await;
    let [(first, first_statsd), (second, second_statsd)] =
        two_members_settled(&setup, protocol, true).await;

    // A member saying it is not live (503) or out of its group fails the test; a probe or a
    // `/status` it did not answer within the second (the machine loaded) is counted apart.
    let until = Instant::now() + GROUP_STALL + Duration::from_secs(4);
    let (mut seen, mut unanswered, mut rounds) = (Vec::new(), 0, 0);
    while Instant::now() < until {
        rounds += 1;
        for (name, member) in [("first", &first), ("second", &second)] {
            let (live, group) = (member.probe("/health/live"), group(member));
            unanswered += usize::from(live.is_none()) + usize::from(group.is_null());
            if live.is_some_and(|code| code != 200) || !(group.is_null() || in_group(&group)) {
                seen.push(format!("{name}: live {live:?}, group {group}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        seen.is_empty(),
        "a member left its group or liveness ({unanswered} probes unanswered): {seen:?}"
    );
    // Each round asks each member twice: one that stopped answering fails here.
    let asked = rounds * 2 * 2;
    assert!(
        unanswered * 2 < asked,
        "the members answered most of what they were asked: {unanswered} of {asked} unanswered"
    );
    for statsd in [&first_statsd, &second_statsd] {
        let values = out_of_group_ms(statsd);
        assert_eq!(values.last(), Some(&0.0), "in the group: {values:?}");
    }
    // The statistics every 500 ms are the member's only: its producer and its re-fetch consumer
    // logged theirs at INFO, whole (rust-rdkafka's default context).
    for member in [&first, &second] {
        let logs = member.log_text().expect("its logs are kept");
        assert!(!logs.contains("Client stats"), "statistics logged");
    }
    assert_eq!(first.terminate(), Some(0));
    assert_eq!(second.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn members_with_and_without_a_partition_are_in_their_group_and_stay_live() {
    let _stack = uses_stack().await;
    idle_member_stays_in_its_group(&[]).await;
}

/// The same with the consumer group protocol of KIP-848, whose member without an assignment
/// goes through other join states.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_group_protocol_an_idle_member_is_in_its_group_and_stays_live() {
    let _stack = uses_stack().await;
    idle_member_stays_in_its_group(&["--kafka-property", "group.protocol=consumer"]).await;
}

/// Readiness waits for the member's first join, which the assignment callback tells when the
/// statistics that say it otherwise are off (`statistics.interval.ms=0`): with the classic
/// protocol the member left without a partition is called with an empty assignment, and is ready
/// as well as the one owning it. With the consumer protocol librdkafka calls nothing for an empty
/// assignment (a first version waited for it, and the idle member never read ready): the member
/// is ready once subscribed, as before readiness waited for the join.
async fn without_statistics_both_members_are_ready_once_in_the_group(protocol: &[&str]) {
    let setup = OnePartition::create("no-stats").await;
    let flags: Vec<&str> = protocol
        .iter()
        .copied()
        .chain(["--kafka-property", "statistics.interval.ms=0"])
        .collect();
    let [(first, _), (second, _)] = two_members_settled(&setup, &flags, false).await;
    for member in [&first, &second] {
        assert_eq!(member.status().unwrap()["joined"], true);
    }
    assert_eq!(first.terminate(), Some(0));
    assert_eq!(second.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn without_statistics_an_idle_member_is_ready_once_in_its_group() {
    let _stack = uses_stack().await;
    without_statistics_both_members_are_ready_once_in_the_group(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn without_statistics_an_idle_member_of_the_consumer_protocol_is_ready_once_in_its_group() {
    let _stack = uses_stack().await;
    without_statistics_both_members_are_ready_once_in_the_group(&[
        "--kafka-property",
        "group.protocol=consumer",
    ])
    .await;
}

/// The group is held by a member with another assignor (`range`; the service uses
/// cooperative-sticky only), so the coordinator refuses the service's JoinGroup for as long as
/// that member is there (what another application, or an older deployment, on the same group id
/// does): the service never joins, `/status` and the gauge say so, and liveness fails past the
/// group stall while the service keeps running (a restart is the kubelet's to make). Once the
/// other member leaves, the service joins, owns the partition and is live again.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_member_its_group_keeps_out_fails_liveness_and_is_live_again_once_it_joins() {
    let _stack = uses_stack().await;
    let setup = OnePartition::create("kept-out").await;
    // The group's first member: the service itself, told to use the `range` assignor only (as an
    // older deployment, or another application on the same group id, would).
    let (other, _other_statsd) =
        setup.member(&["--kafka-property", "partition.assignment.strategy=range"]);
    wait_for(
        "the range member owning the partition",
        JOIN_AND_FLUSH,
        || other.owned() == 1,
    )
    .await;

    let (service, statsd) = setup.member(&[]);
    let out_since_ms = std::sync::OnceLock::new();
    wait_for(
        "the service out of its group, a broker connected",
        JOIN_AND_FLUSH,
        || {
            let group = group(&service);
            let out = group["brokers_up"].as_u64() > Some(0)
                && group["out_since_ms"].is_u64()
                && group["join_state"] != "steady";
            if out {
                let _ = out_since_ms.set(group["out_since_ms"].as_u64().unwrap());
            }
            out
        },
    )
    .await;
    wait_for(
        "liveness failing",
        GROUP_STALL + Duration::from_secs(20),
        || service.probe("/health/live") == Some(503),
    )
    .await;
    // The stall is counted from when the statistics first saw it out with a broker connected,
    // which is no earlier than `out_since_ms` (what the test saw is later still, by as much as
    // the machine is loaded: not a bound). The clocks are the same machine's.
    let failed_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let out_for =
        Duration::from_millis(failed_at_ms.saturating_sub(out_since_ms.get().copied().unwrap()));
    assert!(
        out_for >= GROUP_STALL,
        "liveness failed {out_for:?} after the service went out of its group, before the stall"
    );
    // Never in its group: never ready either, so a rollout would not go on replacing pods that
    // are with one that is not (it read ready from its subscription before).
    let status = service.status().unwrap();
    assert_eq!(
        (
            status["ready"].clone(),
            status["joined"].clone(),
            status["live"].clone()
        ),
        (json!(false), json!(false), json!(false))
    );
    // Connected to a broker all along: the connected gauge counts the time out too, from the
    // first statistics that found a broker connected (an interval, 500 ms here, after the first;
    // on a loaded machine, a few).
    let (out, connected) = out_of_group(&statsd);
    let longest = |values: &[f64]| values.iter().copied().fold(0.0, f64::max);
    assert!(
        longest(&out) >= GROUP_STALL.as_millis() as f64
            && longest(&connected) >= longest(&out) - 2500.0,
        "consumer.out_of_group_ms {out:?} shows the time out, and consumer.out_of_group_connected_ms {connected:?} with it"
    );

    assert_eq!(other.terminate(), Some(0), "the range member leaves");
    owning_its_partition_live_and_ready(&service).await;
    // What was sent while the service was out.
    statsd.read_now();
    wait_for(
        "consumer.out_of_group_ms back to 0",
        Duration::from_secs(10),
        || out_of_group_ms(&statsd).last() == Some(&0.0),
    )
    .await;
    assert_eq!(service.terminate(), Some(0));
}

/// A classic member of a group id, holding it while a thread polls it; it leaves its group when
/// dropped.
struct ClassicHolder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    polling: Option<std::thread::JoinHandle<()>>,
}

impl ClassicHolder {
    /// Joins `group` on `topic` through `config` with the classic protocol, and returns once it
    /// owns a partition.
    async fn join(config: &rdkafka::ClientConfig, group: &str, topic: &str) -> ClassicHolder {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = config
            .clone()
            .set("group.id", group)
            .set("session.timeout.ms", "10000")
            .create()
            .expect("the classic member");
        consumer.subscribe(&[topic]).expect("subscribe");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (owns_tx, owns) = std::sync::mpsc::channel();
        let polling = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = consumer.poll(Duration::from_millis(100));
                    if consumer.assignment().is_ok_and(|a| a.count() > 0) {
                        let _ = owns_tx.send(());
                    }
                }
            }
        });
        let started = Instant::now();
        while owns.try_recv().is_err() {
            assert!(
                started.elapsed() < JOIN_AND_FLUSH,
                "the classic member never joined"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ClassicHolder {
            stop,
            polling: Some(polling),
        }
    }
}

impl Drop for ClassicHolder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(polling) = self.polling.take() {
            let _ = polling.join();
        }
    }
}

/// With the consumer group protocol (KIP-848) the join state does not tell a member kept out of
/// its group from an idle one: both stay `init`. On a broker that does not let a consumer group
/// take over a classic one (`group.consumer.migration.policy=disabled`; so does any broker for a
/// classic group of another protocol type, or with a custom assignor), a classic member holding
/// the group id gets the service's heartbeats refused without end: the service never had a
/// member epoch, so it is out of its group, never ready, and fails liveness past the group stall
/// (before, `init` with the coordinator connected counted as in the group: ready and live
/// throughout, consuming nothing). Once the classic member leaves, it joins and is ready and
/// live.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_protocol_a_member_kept_out_is_never_ready_and_fails_liveness() {
    let _stack = uses_stack().await;
    let broker = secure_broker::SecureBroker::start_without_group_migration("admin", "admin-pw");
    let direct = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.address("PLAINTEXT"))
        .clone();
    let setup = OnePartition::create_on(&direct, "kept-out-848").await;
    let holder = ClassicHolder::join(&direct, &setup.group, &setup.topic).await;
    let (service, _statsd) = setup.member(&["--kafka-property", "group.protocol=consumer"]);
    wait_for(
        "the service out of its group, its coordinator connected",
        JOIN_AND_FLUSH,
        || {
            let group = group(&service);
            group["state"] == "up" && group["out_since_ms"].is_u64()
        },
    )
    .await;
    wait_for(
        "liveness failing",
        GROUP_STALL + Duration::from_secs(20),
        || service.probe("/health/live") == Some(503),
    )
    .await;
    let status = service.status().unwrap();
    assert_eq!(
        (
            status["ready"].clone(),
            status["joined"].clone(),
            status["group"]["join_state"].clone()
        ),
        (json!(false), json!(false), json!("init"))
    );

    drop(holder);
    owning_its_partition_live_and_ready(&service).await;
    assert_eq!(service.terminate(), Some(0));
}

/// The broker stopped for longer than the group stall: the member is out of its group and
/// reaches no broker, which is no reason to restart it — it stays live throughout, through its
/// rejoin once the broker is back too, and owns its partition again.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_member_cut_off_from_every_broker_past_the_group_stall_stays_live() {
    let _stack = stops_stack().await;
    let setup = OnePartition::create("outage").await;
    let (service, statsd) = setup.member(&[]);
    wait_for("the service in its group", JOIN_AND_FLUSH, || {
        service.owned() == 1 && in_group(&group(&service))
    })
    .await;
    statsd.read_now();

    // The service saying it is not live (503) fails the test; a probe it did not answer within
    // the second (the machine loaded: CI runs the chaos harness beside this) is counted apart.
    let (mut not_live, mut unanswered) = (0, 0);
    let mut probe = || match service.probe("/health/live") {
        Some(200) => {}
        Some(_) => not_live += 1,
        None => unanswered += 1,
    };
    let mut unreachable = false;
    {
        let _down = Down::begin("kafka");
        let until = Instant::now() + GROUP_STALL + Duration::from_secs(4);
        while Instant::now() < until {
            probe();
            unreachable |= group(&service)["brokers_up"] == 0;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    assert!(
        unreachable,
        "/status never showed the member without a broker"
    );
    // Out of its group all along, but never while it reached a broker: the alert that pages for a
    // member kept out of its group stays quiet through a Kafka outage.
    let (out, connected) = out_of_group(&statsd);
    assert!(
        out.iter().any(|&ms| ms >= GROUP_STALL.as_millis() as f64)
            && connected
                .iter()
                .all(|&ms| ms < GROUP_STALL.as_millis() as f64),
        "out of its group {out:?}, of that while a broker answered {connected:?}"
    );
    wait_for("the service back in its group", JOIN_AND_FLUSH, || {
        probe();
        service.owned() == 1 && in_group(&group(&service))
    })
    .await;
    assert_eq!(
        not_live, 0,
        "liveness failed during or after the outage ({unanswered} probes unanswered)"
    );
    assert_eq!(service.terminate(), Some(0));
}

/// Static membership with one `group.instance.id` for two members (a values file giving every
/// pod the same one): the second to join fences the first, and librdkafka raises a fatal error
/// in the first, after which it never consumes, heartbeats or commits again. The fenced member
/// exits 1 naming the instance id, at once; it used to log a warning and stay ready and live,
/// owning nothing, until the group stall restarted it.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_static_member_fenced_by_another_with_its_instance_id_exits_saying_so() {
    let _stack = uses_stack().await;
    let setup = OnePartition::create("fenced").await;
    let instance = format!("group.instance.id={}", unique("instance"));
    let static_member = ["--kafka-property", instance.as_str()];
    let (first, _first_statsd) = setup.member(&static_member);
    wait_for(
        "the first member owning the partition",
        JOIN_AND_FLUSH,
        || first.owned() == 1,
    )
    .await;
    let (second, _second_statsd) = setup.member(&static_member);
    wait_for(
        "the second member owning the partition",
        JOIN_AND_FLUSH,
        || second.owned() == 1,
    )
    .await;
    wait_for(
        "the fenced member saying why it stops",
        Duration::from_secs(30),
        || {
            first.log_text().is_some_and(|logs| {
                logs.contains("FencedInstanceId") && logs.contains("`group.instance.id`")
            })
        },
    )
    .await;
    assert_eq!(
        first.exit_within(Duration::from_secs(30)).await,
        Some(1),
        "the fenced member stops"
    );
    assert_eq!(second.probe("/health/live"), Some(200));
    assert_eq!(second.terminate(), Some(0));
}

/// `leave_group` closes a consumer another handle still holds (the pipeline's shutdown: a commit
/// waiting for its answer holds one), and the member leaves at once: a new member of the group
/// takes the partitions well within the session timeout. Closing by dropping a handle would have
/// left the close to whichever handle went last, on its thread, after the shutdown's budget.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn leaving_the_group_closes_a_consumer_another_handle_still_holds() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use replay_ingest::kafka::consumer::{close_within, leave_group};
    use std::sync::Arc;
    const SESSION: Duration = Duration::from_secs(45);
    let _stack = uses_stack().await;
    let one = OnePartition::create("leave").await;
    let member = |group: &str| -> BaseConsumer {
        let consumer: BaseConsumer = kafka()
            .set("group.id", group)
            .set("session.timeout.ms", SESSION.as_millis().to_string())
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.subscribe(&[&one.topic]).unwrap();
        consumer
    };
    let assigned = |consumer: &BaseConsumer, within: Duration| {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            consumer.poll(Duration::from_millis(100));
            if consumer.assignment().is_ok_and(|a| a.count() == 1) {
                return true;
            }
        }
        false
    };
    let first = Arc::new(member(&one.group));
    assert!(
        assigned(&first, Duration::from_secs(60)),
        "the first member joined"
    );
    let held = first.clone();
    let leaving = first.clone();
    let closed = close_within(Duration::from_secs(10), move || leave_group(&leaving)).await;
    assert!(closed, "the close ended within its budget");
    assert!(held.closed(), "closed while another handle holds it");
    let started = Instant::now();
    let second = member(&one.group);
    let joined = tokio::task::spawn_blocking(move || assigned(&second, SESSION))
        .await
        .unwrap();
    assert!(joined, "the second member took the partition");
    assert!(
        started.elapsed() < SESSION / 2,
        "the first left its group: the second did not wait for its session to expire ({:?})",
        started.elapsed()
    );
    drop((first, held));
}

/// Waits for `service` to be in its group, owning the partition, live and ready.
async fn owning_its_partition_live_and_ready(service: &Service) {
    wait_for(
        "the service in its group, owning the partition, live and ready",
        JOIN_AND_FLUSH,
        || {
            service.owned() == 1
                && in_group(&group(service))
                && service.probe("/health/live") == Some(200)
                && service.probe("/health/ready") == Some(200)
        },
    )
    .await;
}
