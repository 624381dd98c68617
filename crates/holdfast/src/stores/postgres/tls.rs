//! TLS for the PostgreSQL store with rustls (ring provider), following
//! libpq's `sslmode` meanings.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::{PostgresConfig, SslMode};
use crate::vocabulary::error::{Error, Result};

const STORE: &str = "postgres";

/// The TLS connector for `config` (also for `sslmode=disable`, where
/// tokio-postgres never uses it) and the tokio-postgres mode to set.
/// `root_pem` is the content of `sslrootcert`, read by the caller.
pub(super) fn connector(
    config: &PostgresConfig,
    root_pem: Option<&[u8]>,
) -> Result<(MakeRustlsConnect, tokio_postgres::config::SslMode)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::backend(STORE, false, e))?;
    let roots = || -> Result<Arc<RootCertStore>> {
        let mut store = RootCertStore::empty();
        let (Some(path), Some(pem)) = (&config.ssl_root_cert, root_pem) else { return Ok(Arc::new(store)) };
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert =
                cert.map_err(|e| Error::invalid("url", format!("sslrootcert {} is not PEM: {e}", path.display())))?;
            store.add(cert).map_err(|e| {
                Error::invalid("url", format!("bad certificate in sslrootcert {}: {e}", path.display()))
            })?;
        }
        if store.is_empty() {
            return Err(Error::invalid("url", format!("sslrootcert {} holds no certificate", path.display())));
        }
        Ok(Arc::new(store))
    };
    let webpki = |roots: Arc<RootCertStore>| {
        WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| Error::invalid("url", format!("cannot use sslrootcert: {e}")))
    };
    use tokio_postgres::config::SslMode as Pg;
    let (tls, mode) = match config.ssl_mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => {
            let verifier = Arc::new(NoVerify(provider.clone()));
            let mode = match config.ssl_mode {
                SslMode::Disable => Pg::Disable,
                SslMode::Prefer => Pg::Prefer,
                _ => Pg::Require,
            };
            (builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth(), mode)
        }
        SslMode::VerifyCa => {
            let verifier = Arc::new(IgnoreName(webpki(roots()?)?));
            (builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth(), Pg::Require)
        }
        SslMode::VerifyFull => (builder.with_webpki_verifier(webpki(roots()?)?).with_no_client_auth(), Pg::Require),
    };
    Ok((MakeRustlsConnect::new(tls), mode))
}

/// `sslmode=prefer|require` without a CA: encrypt, check the handshake
/// signatures, trust any certificate (as libpq does).
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must lead to the CA; the name is not checked.
#[derive(Debug)]
struct IgnoreName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for IgnoreName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
