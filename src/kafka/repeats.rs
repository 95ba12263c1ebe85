//! How often the same client error is logged. librdkafka reports an error on every reconnect
//! that fails: with the brokers down, "all broker connections are down" came every 100 ms from
//! each client at first, 250 lines in a 5 s restart and thousands in an outage of minutes, which
//! buried the lines an operator needs. The first of a kind is logged; its repeats within
//! [`REPEAT_WINDOW`] are counted, and the next line logged of that kind says how many there were.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long the repeats of a logged error go unlogged.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(30);

/// Most kinds remembered at once (a kind is a client, an error code and a reason without its
/// numbers). Past it, kinds not logged within the window are forgotten, and a new kind beyond it
/// is logged every time.
const MOST_KINDS: usize = 256;

/// The kinds logged within the last window, and their unlogged repeats.
#[derive(Default)]
pub struct Repeats {
    kinds: HashMap<String, Seen>,
}

struct Seen {
    logged: Instant,
    unlogged: u64,
}

impl Repeats {
    /// `Some(n)`: log this one, saying it came `n` more times since the last line of its kind;
    /// `None`: a repeat within the window, counted.
    pub fn admit(&mut self, kind: String, now: Instant) -> Option<u64> {
        if let Some(seen) = self.kinds.get_mut(&kind) {
            if now.duration_since(seen.logged) < REPEAT_WINDOW {
                seen.unlogged += 1;
                return None;
            }
            seen.logged = now;
            return Some(std::mem::take(&mut seen.unlogged));
        }
        if self.kinds.len() >= MOST_KINDS {
            self.kinds
                .retain(|_, seen| now.duration_since(seen.logged) < REPEAT_WINDOW);
        }
        if self.kinds.len() < MOST_KINDS {
            let seen = Seen {
                logged: now,
                unlogged: 0,
            };
            self.kinds.insert(kind, seen);
        }
        Some(0)
    }
}

/// The kind of an error `client` reports: the client, the code and the reason with its digits
/// left out (librdkafka's reasons count brokers, time the attempt and count what it suppressed
/// itself: "2/2 brokers are down", "(after 0ms in state CONNECT, 3 identical error(s)
/// suppressed)").
pub fn kind(client: &str, code: &str, reason: &str) -> String {
    let reason: String = reason.chars().filter(|c| !c.is_ascii_digit()).collect();
    format!("{client}\u{0}{code}\u{0}{reason}")
}

/// The process's one record of client errors, shared by every client.
pub fn admit(kind: String) -> Option<u64> {
    static REPEATS: Mutex<Option<Repeats>> = Mutex::new(None);
    let mut repeats = REPEATS.lock().unwrap_or_else(PoisonError::into_inner);
    repeats
        .get_or_insert_with(Repeats::default)
        .admit(kind, Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_within_the_window_are_counted_and_reported_by_the_next_line() {
        let mut repeats = Repeats::default();
        let start = Instant::now();
        let down = || kind("the consumer", "AllBrokersDown", "2/2 brokers are down");
        assert_eq!(repeats.admit(down(), start), Some(0));
        for ms in [100, 200, 29_999] {
            let at = start + Duration::from_millis(ms);
            assert_eq!(repeats.admit(down(), at), None);
        }
        // Another kind, and the same error from another client, are logged meanwhile.
        let refused = kind(
            "the consumer",
            "BrokerTransportFailure",
            "Connection refused",
        );
        assert_eq!(repeats.admit(refused, start), Some(0));
        let producer = kind("a producer", "AllBrokersDown", "1/2 brokers are down");
        assert_eq!(repeats.admit(producer, start), Some(0));
        // The window over: logged again, with the three it left out.
        assert_eq!(repeats.admit(down(), start + REPEAT_WINDOW), Some(3));
        assert_eq!(repeats.admit(down(), start + REPEAT_WINDOW), None);
        assert_eq!(repeats.admit(down(), start + REPEAT_WINDOW * 2), Some(1));
    }

    #[test]
    fn numbers_in_the_reason_do_not_make_a_new_kind() {
        assert_eq!(
            kind("c", "E", "0/2 brokers are down"),
            kind("c", "E", "2/2 brokers are down")
        );
        assert_eq!(
            kind(
                "c",
                "E",
                "b/1: Connection refused (after 0ms in state CONNECT)"
            ),
            kind(
                "c",
                "E",
                "b/2: Connection refused (after 13ms in state CONNECT)"
            )
        );
        assert_ne!(
            kind("c", "E", "Connection refused"),
            kind("c", "E", "SSL handshake failed")
        );
        assert_ne!(kind("c", "E", "x"), kind("c", "F", "x"));
        assert_ne!(kind("c", "E", "x"), kind("d", "E", "x"));
    }

    #[test]
    fn kinds_are_bounded_and_old_ones_make_room() {
        let mut repeats = Repeats::default();
        let start = Instant::now();
        for n in 0..MOST_KINDS {
            assert_eq!(repeats.admit(format!("kind {n}"), start), Some(0));
        }
        // Full, none of them old: a new kind is logged each time, not remembered.
        let late = start + Duration::from_secs(1);
        assert_eq!(repeats.admit("new".into(), late), Some(0));
        assert_eq!(repeats.admit("new".into(), late), Some(0));
        assert_eq!(repeats.kinds.len(), MOST_KINDS);
        // Once the others are past the window, they make room and the new kind is counted.
        let later = start + REPEAT_WINDOW;
        assert_eq!(repeats.admit("new".into(), later), Some(0));
        assert_eq!(repeats.admit("new".into(), later), None);
        assert_eq!(repeats.kinds.len(), 1);
    }
}
