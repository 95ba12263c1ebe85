//! A DogStatsD listener the service sends its metrics to.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// A DogStatsD listener on 127.0.0.1 for the service's metrics. A thread drains the socket as
/// datagrams arrive, so a long run cannot overflow the socket's buffer and lose early ones.
pub struct Statsd {
    port: u16,
    received: std::sync::Arc<std::sync::Mutex<(String, Instant)>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What a test's DogStatsD port received. Reading fails on a metric without the unified service
/// tags (`service:replay-ingest`, `version:<crate version>`); keys leave them out.
pub struct Metrics {
    /// Every datagram, a line each.
    pub text: String,
    /// Counters, summed (they arrive as deltas per flush interval).
    pub counters: BTreeMap<String, f64>,
    /// Every value sent for the other kinds: a distribution's samples, a gauge's successive values.
    pub values: BTreeMap<String, Vec<f64>>,
    pub seen: BTreeSet<String>,
}

impl Metrics {
    /// Successive reads as one: lines and values in order, counters summed.
    pub fn sum(reads: Vec<Metrics>) -> Metrics {
        let mut all = Metrics {
            text: String::new(),
            counters: BTreeMap::new(),
            values: BTreeMap::new(),
            seen: BTreeSet::new(),
        };
        for read in reads {
            all.text.push_str(&read.text);
            for (name, n) in read.counters {
                *all.counters.entry(name).or_default() += n;
            }
            for (name, values) in read.values {
                all.values.entry(name).or_default().extend(values);
            }
            all.seen.extend(read.seen);
        }
        all
    }
}

impl Drop for Statsd {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Statsd {
    pub fn bind() -> Statsd {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let port = socket.local_addr().unwrap().port();
        let received = std::sync::Arc::new(std::sync::Mutex::new((String::new(), Instant::now())));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sink, done) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = socket.recv(&mut buf) {
                    let mut received = sink.lock().unwrap();
                    received.0.push_str(&String::from_utf8_lossy(&buf[..n]));
                    received.0.push('\n');
                    received.1 = Instant::now();
                }
            }
        });
        Statsd {
            port,
            received,
            stop,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything received since the last read, once 200 ms pass without a datagram.
    pub fn read(&self) -> Metrics {
        while self.received.lock().unwrap().1.elapsed() < Duration::from_millis(200) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.read_now()
    }

    /// Everything received since the last read, at once (while the service keeps sending).
    pub fn read_now(&self) -> Metrics {
        let text = std::mem::take(&mut self.received.lock().unwrap().0);
        let (mut counters, mut values, mut seen) = (
            BTreeMap::new(),
            BTreeMap::<String, Vec<f64>>::new(),
            BTreeSet::new(),
        );
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (name, rest) = line.split_once(':').unwrap();
            let mut parts = rest.split('|');
            let (value, kind) = (parts.next().unwrap(), parts.next().unwrap());
            // Every metric carries the unified service tags; keys keep only the metric's own.
            let all_tags: Vec<&str> = parts
                .find_map(|p| p.strip_prefix('#'))
                .unwrap_or("")
                .split(',')
                .collect();
            let global = [
                concat!("version:", env!("CARGO_PKG_VERSION")),
                "service:replay-ingest",
            ];
            assert!(
                global.iter().all(|g| all_tags.contains(g)),
                "{line}: without the global tags {global:?}"
            );
            let tags: Vec<&str> = all_tags
                .into_iter()
                .filter(|t| !global.contains(t))
                .collect();
            let key = if tags.is_empty() {
                name.to_owned()
            } else {
                format!("{name}|{}", tags.join(","))
            };
            let samples = value.split(':').map(|v| v.parse::<f64>().unwrap());
            if kind == "c" {
                *counters.entry(key.clone()).or_default() += samples.sum::<f64>();
            } else {
                values.entry(key.clone()).or_default().extend(samples);
            }
            seen.insert(key);
        }
        Metrics {
            text,
            counters,
            values,
            seen,
        }
    }
}
