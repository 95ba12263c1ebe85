//! A cluster of Apache Kafka brokers of a test's own, from the jars the stack fetched
//! (`REPLAY_INGEST_KAFKA_HOME`): three KRaft nodes in combined mode (each a broker and one of
//! three controller voters), on 127.0.0.1, each with its log directory on disk, replicating
//! every topic three times with `min.insync.replicas=2`, as production runs. A node stopped
//! (cleanly, or with SIGKILL) and started again comes back on the same data and ports: its
//! partitions' leadership moves to the others meanwhile, and the group coordinator with it.
//! Stopped when dropped.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::free_port;
use super::secure_broker::{java, spawn, wait_started};

pub struct Cluster {
    home: String,
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

struct Node {
    /// `None` while the node is down.
    child: Option<Child>,
    config: PathBuf,
    log: PathBuf,
    port: u16,
}

/// The nodes of a cluster: the fewest whose majority survives one node down.
pub const NODES: usize = 3;

impl Cluster {
    /// Formats and starts [`NODES`] nodes, and waits until each serves.
    pub fn start() -> Cluster {
        let home = std::env::var("REPLAY_INGEST_KAFKA_HOME")
            .expect("REPLAY_INGEST_KAFKA_HOME (scripts/stack.sh up)");
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..NODES).map(|_| (free_port(), free_port())).collect();
        let voters: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, controller))| format!("{}@127.0.0.1:{controller}", i + 1))
            .collect();
        let mut nodes = Vec::new();
        for (i, &(port, controller)) in ports.iter().enumerate() {
            let id = i + 1;
            let data = dir.path().join(format!("node-{id}"));
            // A node killed is fenced within 6 s (9 s by default); one starved of CPU for a few
            // seconds on a loaded machine is not. A partition left without a leader in sync is
            // given one out of sync within a second where its topic allows it (5 minutes by
            // default).
            let properties = format!(
                "process.roles=broker,controller\nnode.id={id}\n\
                 controller.quorum.voters={}\n\
                 listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
                 controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
                 listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n\
                 log.dirs={}\n\
                 default.replication.factor=3\nmin.insync.replicas=2\n\
                 offsets.topic.replication.factor=3\noffsets.topic.num.partitions=1\n\
                 transaction.state.log.replication.factor=3\ntransaction.state.log.min.isr=2\n\
                 share.coordinator.state.topic.replication.factor=3\nshare.coordinator.state.topic.min.isr=2\n\
                 auto.create.topics.enable=false\n\
                 broker.session.timeout.ms=6000\nbroker.heartbeat.interval.ms=1000\n\
                 unclean.leader.election.interval.ms=1000\n\
                 group.initial.rebalance.delay.ms=0\ngroup.min.session.timeout.ms=1000\n\
                 group.consumer.min.session.timeout.ms=6000\ngroup.consumer.session.timeout.ms=10000\n\
                 group.consumer.min.heartbeat.interval.ms=500\ngroup.consumer.heartbeat.interval.ms=1000\n\
                 num.network.threads=2\nnum.io.threads=2\n",
                voters.join(","),
                data.display(),
            );
            let config = dir.path().join(format!("node-{id}.properties"));
            std::fs::write(&config, properties).unwrap();
            // A static quorum: every node formatted alike, none `--standalone`.
            let formatted = java(&home, "kafka.tools.StorageTool")
                .args(["format", "-t", "AAECAwQFBgcICQoLDA0ODw", "-c"])
                .arg(&config)
                .output()
                .expect("run the storage tool");
            assert!(
                formatted.status.success(),
                "format node {id}: {}",
                String::from_utf8_lossy(&formatted.stdout)
            );
            nodes.push(Node {
                child: None,
                config,
                log: dir.path().join(format!("node-{id}.log")),
                port,
            });
        }
        let mut cluster = Cluster {
            home,
            nodes,
            _dir: dir,
        };
        // Together: a node serves only once a majority of the controllers elected a leader.
        for node in &mut cluster.nodes {
            node.child = Some(spawn(&cluster.home, &node.config, &node.log));
        }
        for node in &mut cluster.nodes {
            wait_started(node.child.as_mut().unwrap(), &node.log);
        }
        cluster
    }

    /// Every node's address, for clients to bootstrap from any that is up.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client of the test's own.
    pub fn client(&self) -> ClientConfig {
        ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .clone()
    }

    /// Stops node `id` (1 ‥ [`NODES`]) as an operator's rolling restart does: SIGTERM, its
    /// leadership handed over (a controlled shutdown) before it exits.
    pub fn stop(&mut self, id: i32) {
        let node = &mut self.nodes[id as usize - 1];
        let mut child = node.child.take().expect("the node is up");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("node {id} did not stop within 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs node `id`: nothing handed over, as a crashed machine.
    pub fn kill(&mut self, id: i32) {
        let node = &mut self.nodes[id as usize - 1];
        let mut child = node.child.take().expect("the node is up");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts node `id` again on its data, and waits until it serves.
    pub fn start_again(&mut self, id: i32) {
        let node = &mut self.nodes[id as usize - 1];
        assert!(node.child.is_none(), "node {id} is up");
        let mut child = spawn(&self.home, &node.config, &node.log);
        wait_started(&mut child, &node.log);
        node.child = Some(child);
    }

    /// The node leading `topic`'s `partition` now (`__consumer_offsets` 0: the group
    /// coordinator of every group).
    pub fn leader_of(&self, topic: &str, partition: i32) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let leader = self.partitions(topic).and_then(|partitions| {
                partitions
                    .into_iter()
                    .find(|(p, _, _)| *p == partition)
                    .map(|(_, leader, _)| leader)
                    .filter(|&leader| leader > 0)
            });
            match leader {
                Some(leader) => return leader,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
                None => panic!("{topic}/{partition} has no leader after 60 s"),
            }
        }
    }

    /// Waits until every partition of `topics` has all [`NODES`] replicas in sync again: a node
    /// started again has caught up, and stopping another leaves two.
    pub fn wait_in_sync(&self, topics: &[&str]) {
        self.wait_replicas_in_sync(topics, NODES);
    }

    /// Waits until every partition of `topics` has `replicas` replicas in sync.
    pub fn wait_replicas_in_sync(&self, topics: &[&str], replicas: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let synced = topics.iter().all(|topic| {
                self.partitions(topic).is_some_and(|partitions| {
                    !partitions.is_empty() && partitions.iter().all(|(_, _, isr)| *isr == replicas)
                })
            });
            if synced {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{topics:?} not with {replicas} replicas in sync within 120 s"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `topic`'s partitions as the cluster describes them: id, leader, replicas in sync.
    fn partitions(&self, topic: &str) -> Option<Vec<(i32, i32, usize)>> {
        let consumer: BaseConsumer = self.client().create().ok()?;
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()?;
        let topic = metadata.topics().first()?;
        if topic.error().is_some() {
            return None;
        }
        Some(
            topic
                .partitions()
                .iter()
                .map(|p| (p.id(), p.leader(), p.isr().len()))
                .collect(),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
