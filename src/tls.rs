//! TLS to upstreams, for backends that are not on localhost: rustls with aws-lc-rs, whose
//! post-quantum hybrid key exchange (X25519MLKEM768) is offered first. `https://` backend URLs
//! are verified against the system's roots plus `upstream_tls.ca_files`, with the URL's host as
//! the server name. `http://` backends go through the same connector untouched.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Trusted roots: the system's (as rustls-native-certs finds them) and the config's CA files.
pub fn roots(ca_files: &[PathBuf]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    // A system without a CA bundle (a scratch image) still works with ca_files alone.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    for f in ca_files {
        let certs = CertificateDer::pem_file_iter(f)
            .map_err(|e| format!("upstream_tls.ca_files: {}: {e}", f.display()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("upstream_tls.ca_files: {}: {e}", f.display()))?;
        if certs.is_empty() {
            return Err(format!("upstream_tls.ca_files: {}: no PEM certificate in it", f.display()));
        }
        for c in certs {
            roots.add(c).map_err(|e| format!("upstream_tls.ca_files: {}: {e}", f.display()))?;
        }
    }
    Ok(roots)
}

/// The upstream connector: TCP with nodelay and the connect timeout, TLS where the URL says.
pub fn connector(ca_files: &[PathBuf], connect_timeout: Duration) -> Result<Connector, String> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.enforce_http(false);
    let tls =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(ca_files)?)
            .with_no_client_auth();
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// hyper's pooled client, as every upstream caller builds it. An idle connection is reused only
/// within `pool_idle` of its last answer and closed after it: a server closes its own idle
/// connections (vLLM's and llama.cpp's after 5 s), and a request written to one it is closing
/// fails after the upstream may have read it, so it cannot be sent again.
pub fn client_builder(pool_idle: Duration) -> hyper_util::client::legacy::Builder {
    let mut b = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    b.pool_idle_timeout(pool_idle).pool_timer(TokioTimer::new()).timer(TokioTimer::new());
    b
}
