//! A TCP relay in front of one broker listener, for a network partition between one client and
//! the broker: while it is cut, every connection through it is closed and a new one is closed as
//! soon as it arrives; while it hangs, every connection stays open and nothing passes either way
//! (a broker stopped, or a firewall dropping packets); restored, it relays again. The broker
//! advertises the relay's address for that listener (`SecureBroker::start_behind`), so the client
//! reaches the broker through it and nothing else, while other clients use the broker's own
//! listeners. A relay may also hold the
//! broker's answers to offset lookups back (`start_delaying_offset_lookups`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    /// The port clients connect to.
    pub port: u16,
    /// Where the relay forwards to; the broker listens there.
    pub upstream_port: u16,
    state: Arc<watch::Sender<State>>,
    /// Offset lookups relayed (counted by `start_delaying_offset_lookups` relays only).
    lookups: Arc<Lookups>,
}

/// What the relay does with connections.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Relaying,
    Cut,
    Hung,
}

/// ListOffsets requests relayed, and their answers passed on.
#[derive(Default)]
struct Lookups {
    asked: AtomicUsize,
    answered: AtomicUsize,
}

impl Relay {
    /// Listens on 127.0.0.1; forwards to 127.0.0.1:`upstream_port` (nothing need listen there
    /// yet: a connection made before is closed).
    pub async fn start(upstream_port: u16) -> Relay {
        Self::start_on(0, upstream_port).await
    }

    /// As `start`, listening on `port` (0: any free one), for a broker told the relay's address
    /// before the relay runs.
    pub async fn start_on(port: u16, upstream_port: u16) -> Relay {
        Self::start_delaying(port, upstream_port, Duration::ZERO).await
    }

    /// As `start`, each answer to an offset lookup (a ListOffsets request) reaching the client
    /// `delay` late, and the answers after it on the same connection behind it (their order is
    /// kept): a broker slow to answer where a partition begins, the lookup in flight that long.
    /// For a plaintext listener only: it reads Kafka's frames.
    pub async fn start_delaying_offset_lookups(upstream_port: u16, delay: Duration) -> Relay {
        Self::start_delaying(0, upstream_port, delay).await
    }

    async fn start_delaying(port: u16, upstream_port: u16, delay: Duration) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(watch::Sender::new(State::Relaying));
        let states = state.clone();
        let lookups = Arc::new(Lookups::default());
        let counted = lookups.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut state = states.subscribe();
                let now = *state.borrow_and_update();
                match now {
                    State::Relaying => {}
                    State::Cut => continue,
                    State::Hung => {
                        tokio::spawn(async move {
                            let _unanswered = client;
                            let _ = state.wait_for(|&s| s != State::Hung).await;
                        });
                        continue;
                    }
                }
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(mut broker) = TcpStream::connect(("127.0.0.1", upstream_port)).await
                    else {
                        return;
                    };
                    let mut client = client;
                    if delay.is_zero() {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut broker) => {}
                            _ = state.wait_for(|&s| s != State::Relaying) => {}
                        }
                        // Hung: both ends stay open, unread, until the relay is restored.
                        let _ = state.wait_for(|&s| s != State::Hung).await;
                    } else {
                        tokio::select! {
                            _ = relay_delaying(client, broker, delay, &counted) => {}
                            _ = state.wait_for(|&s| s != State::Relaying) => {}
                        }
                    }
                });
            }
        });
        Relay {
            port,
            upstream_port,
            state,
            lookups,
        }
    }

    /// `127.0.0.1:PORT` clients use.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The offset lookups (ListOffsets requests) relayed so far, and how many of their answers
    /// have reached the client, by a relay that delays those answers.
    pub fn offset_lookups(&self) -> (usize, usize) {
        (
            self.lookups.asked.load(Ordering::SeqCst),
            self.lookups.answered.load(Ordering::SeqCst),
        )
    }

    /// Closes every connection through the relay and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.state.send_replace(State::Cut);
    }

    /// Holds every connection through the relay open, passing nothing either way, and answers
    /// new ones with silence, until `restore` (which closes them, as `cut` does). (A relay that
    /// delays offset lookups closes its connections instead.)
    pub fn hang(&self) {
        self.state.send_replace(State::Hung);
    }

    pub fn restore(&self) {
        self.state.send_replace(State::Relaying);
    }
}

/// Kafka's ListOffsets request (its API key).
const LIST_OFFSETS: i16 = 2;

/// Reads one Kafka frame (its 4-byte size, then that many bytes) from `from`, whole.
async fn frame(from: &mut (impl AsyncReadExt + Unpin)) -> Option<Vec<u8>> {
    let size = from.read_i32().await.ok()?;
    let mut frame = size.to_be_bytes().to_vec();
    frame.resize(4 + usize::try_from(size).ok()?, 0);
    from.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

/// Relays between `client` and `broker` frame by frame, the broker's answer to each ListOffsets
/// request reaching the client `delay` after it was read, and every answer after it no sooner;
/// until either side closes; `counted` counts the lookups and their answers. (A request's header
/// holds its API key at bytes 4–5 and its correlation id at 8–11; an answer's correlation id is
/// at bytes 4–7.)
async fn relay_delaying(client: TcpStream, broker: TcpStream, delay: Duration, counted: &Lookups) {
    let (mut client_reads, mut client_writes) = client.into_split();
    let (mut broker_reads, mut broker_writes) = broker.into_split();
    let lookups = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let (answers, mut due) = tokio::sync::mpsc::unbounded_channel();
    let requests = {
        let lookups = lookups.clone();
        async move {
            while let Some(request) = frame(&mut client_reads).await {
                if request.len() >= 12
                    && i16::from_be_bytes([request[4], request[5]]) == LIST_OFFSETS
                {
                    let id = i32::from_be_bytes(request[8..12].try_into().unwrap());
                    lookups.lock().unwrap().insert(id);
                    counted.asked.fetch_add(1, Ordering::SeqCst);
                }
                if broker_writes.write_all(&request).await.is_err() {
                    return;
                }
            }
        }
    };
    let read = async move {
        let mut last = tokio::time::Instant::now();
        while let Some(answer) = frame(&mut broker_reads).await {
            let id = answer
                .get(4..8)
                .map_or(0, |id| i32::from_be_bytes(id.try_into().unwrap()));
            let lookup = lookups.lock().unwrap().remove(&id);
            let at = match lookup {
                true => tokio::time::Instant::now() + delay,
                false => tokio::time::Instant::now(),
            };
            last = last.max(at);
            if answers.send((last, answer, lookup)).is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some((at, answer, lookup)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if client_writes.write_all(&answer).await.is_err() {
                return;
            }
            if lookup {
                counted.answered.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = async { tokio::join!(read, write) } => {}
    }
}
