//! A throw-away certificate authority and a TLS-terminating TCP proxy. The local broker and
//! ClickHouse speak plain TCP; the proxy puts real TLS in front of them, so the service's Kafka
//! and ClickHouse clients are tested through real handshakes against a CA they must be told about.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

pub struct TestCa {
    dir: tempfile::TempDir,
    acceptor: TlsAcceptor,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    /// A CA, and a server certificate it signs for 127.0.0.1 and localhost.
    pub fn new() -> TestCa {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "replay-ingest test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let server =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let server_cert = server.signed_by(&server_key, &issuer).unwrap();

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        // A PEM keystore as Kafka reads one: the PKCS#8 key, then the chain.
        let keystore = format!(
            "{}{}{}",
            server_key.serialize_pem(),
            server_cert.pem(),
            ca_cert.pem()
        );
        std::fs::write(dir.path().join("server.pem"), keystore).unwrap();
        let chain = vec![CertificateDer::from(server_cert.der().to_vec())];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        TestCa {
            dir,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            issuer,
        }
    }

    /// A client certificate the CA signs for `name`, and its key encrypted with `passphrase`
    /// (PKCS#8 with AES-256, as `openssl pkcs8 -topk8` writes it): the two PEM files.
    pub fn client_certificate(&self, name: &str, passphrase: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_file = self.dir.path().join(format!("{name}.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        let plain = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(plain.path(), key.serialize_pem()).unwrap();
        let key_file = self.dir.path().join(format!("{name}.key"));
        let encrypted = std::process::Command::new("openssl")
            .args([
                "pkcs8",
                "-topk8",
                "-v2",
                "aes-256-cbc",
                "-passout",
                "env:PASSPHRASE",
            ])
            .arg("-in")
            .arg(plain.path())
            .arg("-out")
            .arg(&key_file)
            .env("PASSPHRASE", passphrase)
            .status()
            .expect("openssl");
        assert!(encrypted.success(), "openssl pkcs8");
        (cert_file, key_file)
    }

    /// The CA certificate (PEM), for the client to trust.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server's key and certificate chain in one PEM file (Kafka's `ssl.keystore.type=PEM`).
    pub fn keystore_file(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// A proxy on `listener` terminating TLS and forwarding to 127.0.0.1:`target`; runs until the
    /// test's runtime ends. Counts completed handshakes.
    pub fn proxy(&self, listener: std::net::TcpListener, target: u16) -> Arc<AtomicUsize> {
        listener.set_nonblocking(true).unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let (acceptor, counter) = (self.acceptor.clone(), handshakes.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (acceptor, counter) = (acceptor.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                    }
                });
            }
        });
        handshakes
    }
}
