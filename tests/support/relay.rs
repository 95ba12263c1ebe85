//! A TCP relay in front of one broker listener, for a network partition between one client and
//! the broker: while it is cut, every connection through it is closed and a new one is closed as
//! soon as it arrives; restored, it relays again. The broker advertises the relay's address for
//! that listener (`SecureBroker::start_behind`), so the client reaches the broker through it and
//! nothing else, while other clients use the broker's own listeners.

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    /// The port clients connect to.
    pub port: u16,
    /// Where the relay forwards to; the broker listens there.
    pub upstream_port: u16,
    cut: Arc<watch::Sender<bool>>,
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
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(watch::Sender::new(false));
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *cuts.borrow() {
                    continue;
                }
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut broker) = TcpStream::connect(("127.0.0.1", upstream_port)).await
                    else {
                        return;
                    };
                    let mut client = client;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut broker) => {}
                        _ = cut.wait_for(|&cut| cut) => {}
                    }
                });
            }
        });
        Relay {
            port,
            upstream_port,
            cut,
        }
    }

    /// `127.0.0.1:PORT` clients use.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Closes every connection through the relay and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}
