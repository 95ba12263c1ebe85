//! An Apache Kafka broker of a test's own, from the jars the stack fetched
//! (`REPLAY_INGEST_KAFKA_HOME`), with the security listeners the stack's broker does not have:
//! SSL and SASL_SSL with a certificate the test's CA signs, MTLS (SSL whose clients must present
//! a certificate that CA signed), SASL_PLAINTEXT, each taking PLAIN, SCRAM-SHA-256
//! and SCRAM-SHA-512 where SASL applies; when asked, a plaintext listener reached through a
//! relay the test can cut (`RELAYED`), or ACLs enforced (`start_enforcing_acls`). One node,
//! KRaft combined mode, on 127.0.0.1, its log directory on disk: `kill` and `start_again` bring
//! the same broker back on the same data, as the stack's does. Stopped when dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;
use super::relay::Relay;
use super::tls::TestCa;

pub struct SecureBroker {
    child: Child,
    /// The Kafka installation, the broker's properties and its log (stdout).
    home: String,
    config: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
    pub ca: TestCa,
    /// Listener name (`PLAINTEXT`, `SSL`, `SASL_SSL`, `SASL_PLAINTEXT`, and `RELAYED` when
    /// started behind a relay: the port it listens on, behind the relay) → port.
    pub ports: BTreeMap<&'static str, u16>,
}

/// What a broker is started with beyond its listeners.
#[derive(Default)]
struct Setup<'a> {
    /// Users known to PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, with their passwords.
    users: &'a [(&'a str, &'a str)],
    relay: Option<&'a Relay>,
    /// ACLs enforced (Kafka's `StandardAuthorizer`), this user a super user.
    super_user: Option<&'a str>,
    /// `auto.create.topics.enable=true`, Apache Kafka's default (off elsewhere in the tests).
    auto_create_topics: bool,
    /// `group.consumer.migration.policy=disabled`: a classic group with members is never taken
    /// over by a member of the consumer group protocol (Apache Kafka's default is
    /// `bidirectional`).
    no_group_migration: bool,
}

impl SecureBroker {
    /// Starts the broker with `user` known to PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 with `password`.
    pub fn start(user: &str, password: &str) -> SecureBroker {
        Self::start_with(Setup {
            users: &[(user, password)],
            ..Setup::default()
        })
    }

    /// Starts the broker with a plaintext listener `RELAYED` on `relay`'s upstream port,
    /// advertised at the relay's: a client that bootstraps from `relay.address()` reaches the
    /// broker only through it.
    pub fn start_behind(relay: &Relay) -> SecureBroker {
        Self::start_with(Setup {
            users: &[("relayed", "relayed-password")],
            relay: Some(relay),
            ..Setup::default()
        })
    }

    /// Starts the broker enforcing ACLs, as a production cluster with SASL does: `users` (the
    /// first a super user, for the test's own clients) known to PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; every
    /// other principal may do only what an ACL allows it (`support::acl`). The PLAINTEXT
    /// listener, which the broker itself uses, is a super user too.
    pub fn start_enforcing_acls(users: &[(&str, &str)]) -> SecureBroker {
        Self::start_with(Setup {
            users,
            super_user: Some(users[0].0),
            ..Setup::default()
        })
    }

    /// Starts the broker as [`SecureBroker::start`] does, creating a topic a client asks for
    /// and does not find, as Apache Kafka does by default.
    pub fn start_auto_creating_topics(user: &str, password: &str) -> SecureBroker {
        Self::start_with(Setup {
            users: &[(user, password)],
            auto_create_topics: true,
            ..Setup::default()
        })
    }

    /// Starts the broker as [`SecureBroker::start`] does, refusing a member of the consumer group
    /// protocol (KIP-848) the group id of a classic group with members: its heartbeats are
    /// answered `GROUP_ID_NOT_FOUND` for as long as the classic group has a member.
    pub fn start_without_group_migration(user: &str, password: &str) -> SecureBroker {
        Self::start_with(Setup {
            users: &[(user, password)],
            no_group_migration: true,
            ..Setup::default()
        })
    }

    fn start_with(setup: Setup<'_>) -> SecureBroker {
        let relay = setup.relay;
        let home = std::env::var("REPLAY_INGEST_KAFKA_HOME")
            .expect("REPLAY_INGEST_KAFKA_HOME (scripts/stack.sh up)");
        let ca = TestCa::new();
        let dir = tempfile::tempdir().unwrap();
        let controller = free_port();
        let mut ports: BTreeMap<&'static str, u16> =
            ["PLAINTEXT", "SSL", "MTLS", "SASL_SSL", "SASL_PLAINTEXT"]
                .into_iter()
                .map(|name| (name, free_port()))
                .collect();
        if let Some(relay) = relay {
            ports.insert("RELAYED", relay.upstream_port);
        }
        let listeners: Vec<String> = ports
            .iter()
            .map(|(name, port)| format!("{name}://127.0.0.1:{port}"))
            .collect();
        let advertised: Vec<String> = ports
            .iter()
            .map(|(&name, &port)| match (name, relay) {
                ("RELAYED", Some(relay)) => format!("{name}://{}", relay.address()),
                _ => format!("{name}://127.0.0.1:{port}"),
            })
            .collect();
        let keystore = ca.keystore_file();
        let plain_users: String = setup
            .users
            .iter()
            .map(|(user, password)| format!(" user_{user}=\"{password}\""))
            .collect();
        let plain_login = format!(
            "org.apache.kafka.common.security.plain.PlainLoginModule required{plain_users};"
        );
        let scram_login = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
        let mut properties = format!(
            "process.roles=broker,controller\nnode.id=1\n\
             controller.quorum.bootstrap.servers=127.0.0.1:{controller}\n\
             listeners=CONTROLLER://127.0.0.1:{controller},{}\nadvertised.listeners={}\n\
             controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,RELAYED:PLAINTEXT\n\
             log.dirs={}\noffsets.topic.replication.factor=1\noffsets.topic.num.partitions=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             share.coordinator.state.topic.replication.factor=1\nshare.coordinator.state.topic.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\ngroup.min.session.timeout.ms=1000\nauto.create.topics.enable={}\n\
             group.consumer.min.session.timeout.ms=6000\ngroup.consumer.session.timeout.ms=10000\n\
             group.consumer.min.heartbeat.interval.ms=500\ngroup.consumer.heartbeat.interval.ms=1000\n\
             num.network.threads=2\nnum.io.threads=2\n",
            listeners.join(","),
            advertised.join(","),
            dir.path().join("data").display(),
            setup.auto_create_topics,
        );
        if setup.no_group_migration {
            properties += "group.consumer.migration.policy=disabled\n";
        }
        for listener in ["ssl", "mtls", "sasl_ssl"] {
            properties += &format!(
                "listener.name.{listener}.ssl.keystore.type=PEM\nlistener.name.{listener}.ssl.keystore.location={}\n",
                keystore.display()
            );
        }
        // MTLS: TLS whose clients must present a certificate the test's CA signed.
        properties += &format!(
            "listener.name.mtls.ssl.client.auth=required\nlistener.name.mtls.ssl.truststore.type=PEM\n\
             listener.name.mtls.ssl.truststore.location={}\n",
            ca.ca_file().display()
        );
        for listener in ["sasl_ssl", "sasl_plaintext"] {
            properties += &format!(
                "listener.name.{listener}.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512\n\
                 listener.name.{listener}.plain.sasl.jaas.config={plain_login}\n\
                 listener.name.{listener}.scram-sha-256.sasl.jaas.config={scram_login}\n\
                 listener.name.{listener}.scram-sha-512.sasl.jaas.config={scram_login}\n"
            );
        }
        if let Some(user) = setup.super_user {
            properties += &format!(
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
                 super.users=User:ANONYMOUS;User:{user}\n"
            );
        }
        let config = dir.path().join("server.properties");
        std::fs::write(&config, properties).unwrap();
        let scram = setup.users.iter().flat_map(|(user, password)| {
            ["SCRAM-SHA-256", "SCRAM-SHA-512"]
                .into_iter()
                .flat_map(move |mechanism| {
                    [
                        "--add-scram".to_owned(),
                        format!("{mechanism}=[name={user},password={password}]"),
                    ]
                })
        });
        let formatted = java(&home, "kafka.tools.StorageTool")
            .args([
                "format",
                "--standalone",
                "-t",
                "AAECAwQFBgcICQoLDA0ODw",
                "-c",
            ])
            .arg(&config)
            .args(scram)
            .output()
            .expect("run the storage tool");
        assert!(
            formatted.status.success(),
            "format: {}",
            String::from_utf8_lossy(&formatted.stdout)
        );
        let log = dir.path().join("kafka.log");
        SecureBroker {
            child: launch(&home, &config, &log),
            home,
            config,
            log,
            _dir: dir,
            ca,
            ports,
        }
    }

    /// SIGKILLs the broker: nothing flushed or closed, as a crashed node.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the broker again on the same log directory, listeners, certificate and users
    /// (after `kill`), and waits until it serves.
    pub fn start_again(&mut self) {
        self.child = launch(&self.home, &self.config, &self.log);
    }

    /// Changes `user`'s PLAIN password to `password` as an operator rotating it does: the
    /// broker stopped, its JAAS configuration given the new one, started again (on the same log
    /// directory). SCRAM credentials are left as they were.
    pub fn rotate_plain_password(&mut self, user: &str, password: &str) {
        self.kill();
        let properties = std::fs::read_to_string(&self.config).unwrap();
        let entry = format!(" user_{user}=\"");
        let rotated: String = properties
            .split_inclusive('\n')
            .map(|line| match line.find(&entry) {
                Some(at) if line.contains("plain.sasl.jaas.config") => {
                    let value = at + entry.len();
                    let end = value + line[value..].find('"').unwrap();
                    format!("{}{password}{}", &line[..value], &line[end..])
                }
                _ => line.to_owned(),
            })
            .collect();
        assert_ne!(rotated, properties, "{user} is a PLAIN user");
        std::fs::write(&self.config, rotated).unwrap();
        self.start_again();
    }

    /// `127.0.0.1:PORT` of listener `name`.
    pub fn address(&self, name: &str) -> String {
        format!("127.0.0.1:{}", self.ports[name])
    }

    /// A client of the test's own: SASL_SSL with SCRAM-SHA-512 as `user`, trusting the CA.
    pub fn sasl_ssl_client(&self, user: &str, password: &str) -> rdkafka::ClientConfig {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.address("SASL_SSL"))
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", user)
            .set("sasl.password", password)
            .set("ssl.ca.location", self.ca.ca_file().to_str().unwrap())
            .clone()
    }

    /// The service's flags for the same: SASL_SSL with SCRAM-SHA-512 as `user`, the password
    /// read from `password_file`, trusting the CA.
    pub fn sasl_ssl_flags(&self, user: &str, password_file: &Path) -> Vec<String> {
        [
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-512",
            "--kafka-sasl-username",
            user,
            "--kafka-sasl-password-file",
            password_file.to_str().unwrap(),
            "--kafka-ssl-ca-location",
            self.ca.ca_file().to_str().unwrap(),
        ]
        .map(str::to_owned)
        .into()
    }
}

/// `java` with the broker's settings (a small heap, the serial collector, the client compiler
/// only), running `main` from the jars under `home`.
pub(super) fn java(home: &str, main: &str) -> Command {
    let mut command = Command::new("java");
    command
        .args([
            "-Xms64m",
            "-Xmx384m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
        ])
        .arg(format!(
            "-Dlog4j2.configurationFile={home}/log4j2.properties"
        ))
        .args(["-cp", &format!("{home}/libs/*"), main]);
    command
}

/// Starts the broker on `config`, its output in `log` (truncated), and waits until it serves.
fn launch(home: &str, config: &Path, log: &Path) -> Child {
    let mut child = spawn(home, config, log);
    wait_started(&mut child, log);
    child
}

/// Starts a broker on `config`, its output in `log` (truncated), without waiting for it: the
/// nodes of a cluster serve only once a majority of their controllers is up.
pub(super) fn spawn(home: &str, config: &Path, log: &Path) -> Child {
    java(home, "kafka.Kafka")
        .arg(config)
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kafka")
}

/// Waits until the broker `child` serves (its `log` says so); kills it and fails the test if
/// it exits or has not within two minutes (three JVMs starting at once on a loaded machine).
pub(super) fn wait_started(child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("Kafka Server started")
    {
        if Instant::now() >= deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "kafka did not start: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for SecureBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
