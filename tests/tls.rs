//! TLS to upstreams: an https:// backend whose certificate comes from a private CA is reached
//! when `upstream_tls.ca_files` names that CA, over a post-quantum key exchange, and refused
//! with a clear 502 when it does not.
//! The certificates are made by the openssl command line at test time.

use crate::common::*;
use http::Response;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use rustls::NamedGroup;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"over TLS"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;

/// A CA and a server certificate for `localhost` signed by it.
fn make_certs(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=goodput test CA"],
    ]
    .concat());
    run(&[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]]
        .concat());
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

/// An HTTPS upstream answering every request with ANSWER; the key exchange group of each
/// handshake it completed is pushed to the returned list.
async fn spawn_tls_upstream(dir: &Path) -> (SocketAddr, Arc<Mutex<Vec<NamedGroup>>>) {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(dir.join("server.pem")).unwrap().collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let cfg =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let groups = Arc::new(Mutex::new(Vec::new()));
    let seen = groups.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else { return };
                if let Some(g) = tls.get_ref().1.negotiated_key_exchange_group() {
                    seen.lock().unwrap().push(g.name());
                }
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(bytes::Bytes::from(ANSWER)))
                            .unwrap(),
                    )
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    (addr, groups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_are_verified_against_the_configured_ca() {
    let dir = temp_dir("tls");
    make_certs(&dir);
    let (up, groups) = spawn_tls_upstream(&dir).await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let backend = format!("backends:\n  - name: tls\n    url: https://localhost:{}\n", up.port());

    let gp =
        Goodput::start(&format!("{backend}upstream_tls:\n  ca_files: [{}]\n", dir.join("ca.pem").display()));
    let r = send(gp.proxy, post_json("/v1/chat/completions", chat)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), ANSWER, "bytes changed over TLS");
    let rec = &gp.records(1).await[0];
    assert_eq!((rec["outcome"].as_str(), rec["completion_tokens"].as_u64()), (Some("ok"), Some(2)), "{rec}");
    // The server accepts every group rustls knows, so the agreed one is the client's first choice
    // (the health probes' handshakes included).
    let groups = groups.lock().unwrap().clone();
    assert!(!groups.is_empty() && groups.iter().all(|g| *g == NamedGroup::X25519MLKEM768), "{groups:?}");
    drop(gp);

    // Without the CA the certificate is unknown: a 502 that says so, never plaintext.
    let gp = Goodput::start(&backend);
    let r = send(gp.proxy, post_json("/v1/chat/completions", chat)).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap_or_default().to_lowercase();
    assert!(msg.contains("certificate"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_ca_file_that_is_not_pem_is_a_clear_start_up_error() {
    let dir = temp_dir("tls-bad");
    let bad = dir.join("bad.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let cfg = dir.join("goodput.yaml");
    std::fs::write(
        &cfg,
        format!(
            "backends:\n  - name: a\n    url: https://localhost:1\nupstream_tls:\n  ca_files: [{}]\n",
            bad.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("upstream_tls.ca_files") && err.contains("bad.pem"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
