//! The Kafka producer every sink and tool publishes with: each record's delivery is a future, and
//! deliveries are served by a thread of its own that sleeps until librdkafka has an event for it.
//!
//! rust-rdkafka's `FutureProducer` serves them by polling every 100 ms, and its poll rounds the
//! time left down to whole milliseconds: the last fraction of each wait is polled with a zero
//! timeout, in a loop — about 0.7 ms of CPU every 100 ms per producer, idle or not. Here
//! librdkafka calls back when its queue of events stops being empty
//! (`rd_kafka_queue_cb_event_enable`), the callback unparks the thread, and the thread serves
//! every queued event and parks again.

use std::ffi::c_void;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use rdkafka::bindings as rdsys;
use rdkafka::config::{FromClientConfig, FromClientConfigAndContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message, ToBytes};
use rdkafka::producer::future_producer::{Delivery, OwnedDeliveryResult};
use rdkafka::producer::{BaseProducer, BaseRecord, FutureRecord, Producer as _, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};

/// A record's delivery: its partition and offset, or why it failed. librdkafka reports it within
/// `message.timeout.ms` — except a delivery whose request was in flight when the broker stopped
/// answering: the idempotent producer keeps that record past the timeout, to send again once the
/// broker answers, and whoever awaited it waited for good (a tool's run; a flush, wedged until
/// liveness restarted the pod). So a delivery is awaited at most [`super::answer_deadline`] with
/// the producer's `message.timeout.ms`, from its first poll, then ends
/// [`Undelivered::Unanswered`]: the record may yet reach its topic. Dropping the last
/// [`Producer`] fails what is still queued; a delivery librdkafka cannot report within the drop's
/// flush (500 ms) ends [`Undelivered::Dropped`].
pub struct DeliveryFuture {
    report: oneshot::Receiver<OwnedDeliveryResult>,
    patience: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// Why a delivery ended without librdkafka's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undelivered {
    /// The producer was dropped before it reported the delivery.
    Dropped,
    /// No report within this long.
    Unanswered(Duration),
}

impl std::fmt::Display for Undelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Undelivered::Dropped => f.write_str("the producer was dropped before the delivery"),
            Undelivered::Unanswered(waited) => write!(
                f,
                "no delivery report within {waited:?}: the broker stopped answering mid-request (the record may yet reach the topic)"
            ),
        }
    }
}

impl Future for DeliveryFuture {
    type Output = Result<OwnedDeliveryResult, Undelivered>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(report) = Pin::new(&mut self.report).poll(cx) {
            return Poll::Ready(report.map_err(|oneshot::Canceled| Undelivered::Dropped));
        }
        let patience = self.patience;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(patience)));
        deadline
            .as_mut()
            .poll(cx)
            .map(|()| Err(Undelivered::Unanswered(patience)))
    }
}

/// How long [`Producer::send`] waits before enqueuing again while librdkafka's queue is full.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(100);

/// A cheaply cloned handle on one producer; the last one dropped stops its thread and drops the
/// records still queued (their deliveries fail).
#[derive(Clone)]
pub struct Producer(Arc<Served>);

struct Served {
    producer: Arc<BaseProducer<Deliveries>>,
    /// `message.timeout.ms`: how long [`Producer::send`] tries to enqueue while librdkafka's
    /// queue is full.
    message_timeout: Duration,
    /// How long a delivery is awaited ([`DeliveryFuture`]).
    patience: Duration,
    /// librdkafka's event queue: the wake-up callback is registered on it, the thread reads its
    /// length.
    queue: Arc<Queue>,
    /// The serving thread's handle, which the callback unparks: its opaque pointer, leaked from
    /// a `Box` and freed in `drop` once the callback is unregistered.
    thread: NonNull<Thread>,
    handle: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

// SAFETY: `thread` points to a `Thread` (itself `Send + Sync`) that only `drop` frees.
unsafe impl Send for Served {}
unsafe impl Sync for Served {}

/// Completes each record's [`DeliveryFuture`].
struct Deliveries;

impl ClientContext for Deliveries {
    /// librdkafka's own lines and errors ([`super::log_line`], [`super::client_error`]). A
    /// delivery that fails for good fails its send, which the sink reports.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, line: &str) {
        super::log_line(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        super::client_error("a producer", &error, reason);
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<oneshot::Sender<OwnedDeliveryResult>>;

    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let _ = tx.send(match result {
            Ok(message) => Ok(Delivery {
                partition: message.partition(),
                offset: message.offset(),
                timestamp: message.timestamp(),
            }),
            Err((error, message)) => Err((error.clone(), message.detach())),
        });
    }
}

/// A reference of our own on the producer's main queue (where librdkafka puts its events).
struct Queue(*mut rdsys::rd_kafka_queue_t);

// SAFETY: librdkafka's queue handles may be used from any thread.
unsafe impl Send for Queue {}
unsafe impl Sync for Queue {}

impl Queue {
    fn main(producer: &BaseProducer<Deliveries>) -> Queue {
        // SAFETY: the client is alive; the reference is released in `drop`.
        Queue(unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) })
    }

    fn len(&self) -> usize {
        // SAFETY: the queue is held until `drop`.
        unsafe { rdsys::rd_kafka_queue_length(self.0) }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken in `main`, once.
        unsafe { rdsys::rd_kafka_queue_destroy(self.0) }
    }
}

/// Called by librdkafka, with the queue locked, when an event lands on an empty queue: wakes the
/// serving thread and nothing more (librdkafka must not be called from here).
unsafe extern "C" fn wake(_: *mut rdsys::rd_kafka_t, thread: *mut c_void) {
    // SAFETY: `thread` is a `Served`'s thread handle, which it frees only after unregistering
    // this callback.
    unsafe { &*thread.cast::<Thread>() }.unpark();
}

/// For unit tests: a producer's settings whose only broker address has nothing listening, so
/// that each delivery times out after `message_timeout_ms`, never sent.
#[cfg(test)]
pub fn unreachable(message_timeout_ms: u32) -> ClientConfig {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free local port");
    ClientConfig::new()
        .set("bootstrap.servers", closed.to_string())
        .set("message.timeout.ms", message_timeout_ms.to_string())
        .clone()
}

impl FromClientConfig for Producer {
    fn from_config(config: &ClientConfig) -> KafkaResult<Producer> {
        // librdkafka's default when unset; `delivery.timeout.ms`, its alias, is refused in
        // `--kafka-property`.
        let message_timeout_ms = config
            .get("message.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(300_000);
        if message_timeout_ms == 0 {
            // librdkafka's "no timeout": a delivery to a broker that stops answering would be
            // awaited for good.
            return Err(KafkaError::ClientCreation(
                "message.timeout.ms=0 (deliveries without a deadline) is refused: give a timeout"
                    .to_owned(),
            ));
        }
        let message_timeout = Duration::from_millis(message_timeout_ms);
        let patience = super::answer_deadline(message_timeout);
        let producer = Arc::new(BaseProducer::from_config_and_context(config, Deliveries)?);
        // The producer's main queue is never forwarded (only a consumer's is), so the callback
        // belongs on it.
        let queue = Arc::new(Queue::main(&producer));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (producer, queue, stop) = (producer.clone(), queue.clone(), stop.clone());
            std::thread::Builder::new()
                .name("kafka-deliveries".into())
                .spawn(move || serve(&producer, &queue, &stop))
                .map_err(|e| KafkaError::ClientCreation(format!("starting its thread: {e}")))?
        };
        let thread = NonNull::from(Box::leak(Box::new(handle.thread().clone())));
        // SAFETY: the opaque is the leaked thread handle, freed only after `Served::drop` has
        // unregistered the callback.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(queue.0, Some(wake), thread.as_ptr().cast());
        }
        // Events queued before the callback was registered.
        handle.thread().unpark();
        Ok(Producer(Arc::new(Served {
            producer,
            message_timeout,
            patience,
            queue,
            thread,
            handle: Some(handle),
            stop,
        })))
    }
}

/// The serving thread: every queued event, then asleep until [`wake`] (or `stop`).
fn serve(producer: &BaseProducer<Deliveries>, events: &Queue, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        // One event per zero-timeout poll; a delivery event carries many records. An event that
        // lands once the queue was seen empty unparks this thread, so the park returns at once.
        while events.len() > 0 {
            producer.poll(Duration::ZERO);
        }
        std::thread::park();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: unregisters `wake` under the queue's lock, which every call of it holds: once
        // this returns, none runs or will, and `thread` can be freed.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue.0, None, std::ptr::null_mut());
            drop(Box::from_raw(self.thread.as_ptr()));
        }
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            handle.thread().unpark();
            let _ = handle.join();
        }
        // Then the fields drop, the producer first and, the thread's clone gone, its last
        // reference: it fails the records still queued and serves their deliveries here. Like
        // rust-rdkafka's producers, the last handle's drop blocks for that (at most 500 ms).
    }
}

impl Producer {
    /// Enqueues `record`; its delivery completes once the broker has acknowledged it or
    /// librdkafka gave up (`message.timeout.ms`). Fails at once when librdkafka refuses it (queue
    /// full, too large, unknown partition).
    pub fn enqueue<K, P>(&self, record: FutureRecord<'_, K, P>) -> KafkaResult<DeliveryFuture>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (record, delivery) = self.with_delivery(record);
        self.0
            .producer
            .send(record)
            .map(|()| delivery)
            .map_err(|(e, _)| e)
    }

    /// Sends `record` and waits for its delivery, enqueuing it again while librdkafka's queue is
    /// full, for up to the producer's `message.timeout.ms` (which librdkafka counts from the
    /// enqueuing): at most that and [`DeliveryFuture`]'s deadline in all.
    pub async fn send<K, P>(&self, record: FutureRecord<'_, K, P>) -> Result<Delivery, KafkaError>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let start = Instant::now();
        let (mut record, delivery) = self.with_delivery(record);
        loop {
            match self.0.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), again))
                    if start.elapsed() < self.0.message_timeout =>
                {
                    record = again;
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
        match delivery.await {
            Ok(delivery) => delivery.map_err(|(e, _)| e),
            Err(Undelivered::Dropped) => Err(KafkaError::Canceled),
            Err(Undelivered::Unanswered(_)) => Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut,
            )),
        }
    }

    /// `record` with a new delivery's sender as its opaque (rust-rdkafka keeps that conversion
    /// private), and the delivery.
    fn with_delivery<'a, K, P>(
        &self,
        record: FutureRecord<'a, K, P>,
    ) -> (
        BaseRecord<'a, K, P, Box<oneshot::Sender<OwnedDeliveryResult>>>,
        DeliveryFuture,
    )
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (tx, report) = oneshot::channel();
        let record = BaseRecord {
            topic: record.topic,
            partition: record.partition,
            payload: record.payload,
            key: record.key,
            timestamp: record.timestamp,
            headers: record.headers,
            delivery_opaque: Box::new(tx),
        };
        let delivery = DeliveryFuture {
            report,
            patience: self.0.patience,
            deadline: None,
        };
        (record, delivery)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A producer with nobody to talk to: librdkafka fails each delivery after 200 ms.
    fn unreachable_producer() -> Producer {
        unreachable(200).create().unwrap()
    }

    /// A producer without a delivery timeout is refused: its deliveries could be awaited for good.
    #[test]
    fn a_producer_without_a_delivery_timeout_is_refused() {
        let refused = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("message.timeout.ms", "0")
            .create::<Producer>()
            .err()
            .expect("refused");
        assert!(
            refused.to_string().contains("message.timeout.ms=0"),
            "{refused}"
        );
    }

    /// The serving thread wakes for the failure (nothing else polls this producer), and so does
    /// it for a second one after it went back to sleep.
    #[tokio::test]
    async fn deliveries_complete_without_anyone_polling() {
        let producer = unreachable_producer();
        for _ in 0..2 {
            let delivery = producer
                .enqueue(FutureRecord::<(), _>::to("t").payload("v"))
                .unwrap();
            let result = tokio::time::timeout(Duration::from_secs(10), delivery)
                .await
                .expect("the delivery was served")
                .expect("the producer is alive");
            let (error, message) = result.unwrap_err();
            assert_eq!(
                error,
                KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)
            );
            assert_eq!(message.payload(), Some(&b"v"[..]));
        }
    }

    /// A delivery librdkafka never reports (its request in flight to a broker that stopped
    /// answering) ends at its deadline: the producer's `message.timeout.ms` twice and 5 s more
    /// (a deadline of 50 ms is awaited here).
    #[tokio::test]
    async fn a_delivery_never_reported_ends_unanswered_at_its_deadline() {
        let producer = unreachable_producer();
        assert_eq!(producer.0.patience, Duration::from_millis(5_400));
        let (_reporter, report) = oneshot::channel();
        let patience = Duration::from_millis(50);
        let delivery = DeliveryFuture {
            report,
            patience,
            deadline: None,
        };
        assert_eq!(
            delivery.await.map(|_| ()),
            Err(Undelivered::Unanswered(Duration::from_millis(50)))
        );
    }

    /// Dropping the last handle stops the thread (the drop joins it) and fails what was still
    /// queued.
    #[tokio::test]
    async fn dropping_the_producer_fails_its_queued_deliveries_and_stops_its_thread() {
        let producer = unreachable_producer();
        let delivery = producer
            .enqueue(FutureRecord::<(), _>::to("t").payload("v"))
            .unwrap();
        let dropped = tokio::task::spawn_blocking(move || drop(producer));
        tokio::time::timeout(Duration::from_secs(10), dropped)
            .await
            .expect("the drop joined the serving thread")
            .unwrap();
        let (error, _) = delivery
            .await
            .expect("served before the drop returned")
            .unwrap_err();
        assert_eq!(
            error,
            KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue)
        );
    }
}
