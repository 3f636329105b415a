//! TLS for tests: a private CA that issues server (and client) certificates, client
//! configurations (trusting that CA, presenting a client certificate or not, or accepting any
//! certificate the way Envoy AI Gateway connects to an endpoint picker), and HTTP/1.1 over TLS.
#![allow(
    clippy::expect_used,
    reason = "test helpers: a failure is a failed test"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::{Error, Response, TIMEOUT};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A private certificate authority.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM-encoded.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The private key (PKCS#8 PEM).
    pub key_pem: String,
    /// The certificate (DER), to compare with what a server presents.
    pub der: CertificateDer<'static>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA certificate (PEM), what a client trusts.
    pub fn cert_pem(&self) -> String {
        pem("CERTIFICATE", self.issuer.der())
    }

    /// Issues a certificate for `names` (DNS names or IP addresses): a server's, and, carrying
    /// no extended key usage, good as a client's too.
    pub fn issue(&self, names: &[&str]) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        self.issue_with(CertificateParams::new(names).expect("leaf parameters"))
    }

    /// A certificate for `names` whose extended key usage is server authentication only: a
    /// server's certificate, refused where a client's is asked for.
    pub fn issue_for_servers_only(&self, names: &[&str]) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("leaf parameters");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        self.issue_with(params)
    }

    /// [`TestCa::issue`] valid only from `not_before` to `not_after` (year, month, day, UTC
    /// midnight): an expired certificate, or one not valid yet.
    pub fn issue_valid(
        &self,
        names: &[&str],
        not_before: (i32, u8, u8),
        not_after: (i32, u8, u8),
    ) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("leaf parameters");
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        self.issue_with(params)
    }

    fn issue_with(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert_pem: pem("CERTIFICATE", cert.der()),
            key_pem: pem("PRIVATE KEY", &key.serialize_der()),
            der: cert.der().clone(),
        }
    }

    /// Writes the CA certificate to `dir/ca.pem` and returns its path.
    pub fn write_ca(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.cert_pem()).expect("write ca.pem");
        path
    }

    /// A client configuration trusting this CA only, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        self.client_config_presenting(alpn, None)
    }

    /// A client configuration trusting this CA only, offering `alpn`, presenting `leaf` (any
    /// CA's) when the server asks for a client certificate.
    pub fn client_config_presenting(
        &self,
        alpn: &[&[u8]],
        leaf: Option<&Leaf>,
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).expect("CA root");
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        let mut config = match leaf {
            None => builder.with_no_client_auth(),
            Some(leaf) => {
                let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())
                    .expect("the leaf's key");
                builder
                    .with_client_auth_cert(vec![leaf.der.clone()], key)
                    .expect("client certificate")
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// `der` as a PEM block with `label` (64 base64 characters a line, RFC 7468).
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

impl Leaf {
    /// Writes `cert.pem` and `key.pem` into `dir` (replacing them atomically by rename, as a
    /// Kubernetes Secret update does) and returns their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        for (path, text) in [(&cert, &self.cert_pem), (&key, &self.key_pem)] {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).expect("write PEM");
            std::fs::rename(&tmp, path).expect("rename PEM");
        }
        (cert, key)
    }
}

/// Accepts any server certificate: the verification Envoy AI Gateway applies to an endpoint
/// picker's (an empty validation context). Signatures are still checked.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A client configuration that accepts any server certificate, offering `alpn`.
pub fn accept_any_config(alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let provider = provider();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Opens TCP to `addr` and runs the TLS handshake for `name`.
pub async fn connect(
    addr: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(name.to_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    TlsConnector::from(config).connect(name, tcp).await
}

/// The leaf certificate `addr` presents to a client asking for `name` (any certificate
/// accepted).
pub async fn peer_certificate(addr: SocketAddr, name: &str) -> CertificateDer<'static> {
    let tls = tokio::time::timeout(
        TIMEOUT,
        connect(addr, name, accept_any_config(&[b"h2", b"http/1.1"])),
    )
    .await
    .expect("TLS handshake timed out")
    .expect("TLS handshake");
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .expect("a server certificate")
        .clone()
        .into_owned()
}

/// Sends `request` over HTTP/1.1 on a fresh TLS connection to `addr` (verifying `name` with
/// `config`) and reads the whole answer within `timeout`.
pub async fn send_within(
    addr: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
    request: Request<Bytes>,
    timeout: Duration,
) -> Result<Response, Error> {
    crate::exchange(addr, name, connect(addr, name, config), request, timeout).await
}
