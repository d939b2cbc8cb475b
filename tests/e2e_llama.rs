//! End to end with the real things: llama.cpp's OpenAI-compatible server serving SmolLM2-135M
//! behind goodput, and the official openai Python SDK in front. `scripts/setup-llm.sh` installs
//! both (cached); `scripts/test.sh` exports where they are.

use crate::common::llama::{llm_env, start_llama};
use crate::common::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_through_goodput_over_llama_cpp() {
    let llm = llm_env();
    let llama = start_llama(&llm).await;
    let gp = Goodput::start(&format!(
        "backends:\n  - name: llama\n    url: http://127.0.0.1:{}\n    models: [smollm2]\n    tokenizer: {}\n",
        llama.port,
        llm.tokdir.join("tokenizer.json").display()
    ));
    let out = {
        let venv = llm.venv.clone();
        let direct = format!("http://127.0.0.1:{}/v1", llama.port);
        let proxy = format!("http://{}/v1", gp.proxy);
        tokio::task::spawn_blocking(move || {
            Command::new(venv.join("bin/python"))
                .arg("tests/e2e/openai_client.py")
                .args([&direct, &proxy])
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert!(out.status.success(), "client failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let direct = seen["direct"].as_array().unwrap();
    let proxy = seen["proxy"].as_array().unwrap();

    // 1. Identity: through goodput the SDK gets what it gets directly.
    for (d, p) in direct.iter().zip(proxy) {
        assert_eq!(
            d["text"], p["text"],
            "{} stream={}: text differs through the proxy",
            d["kind"], d["stream"]
        );
        assert!(!p["text"].as_str().unwrap().is_empty());
        assert!(!p["usage_seen"].as_bool().unwrap_or(false), "the client did not ask for usage");
    }
    // Same prompt at temperature 0: the stream and the non-stream answer are the same text, so
    // the server's non-stream usage is the true token count of the streamed text.
    for k in [0, 2] {
        assert_eq!(proxy[k]["text"], proxy[k + 1]["text"], "stream and non-stream outputs differ");
    }

    // 2. goodput's records, in the order the proxy saw them: warm-up, the 4 cases (each
    // streamed one followed by its repeats), the cancelled one.
    let reps = |c: &Value| c["reps"].as_array().map_or(0, Vec::len);
    let n_cases: usize = proxy.iter().map(|c| 1 + reps(c)).sum();
    let mut recs = gp.records(n_cases + 2).await;
    recs.sort_by_key(|r| r["id"].as_u64().unwrap());
    let mut next = 1;
    for (i, client) in proxy.iter().enumerate() {
        let at = next;
        let rec = &recs[at];
        next += 1 + reps(client);
        assert_eq!(rec["stream"], client["stream"], "record {i} order");
        assert_eq!(rec["outcome"], "ok");
        assert_eq!(rec["model"], "smollm2");
        if client["stream"] == true {
            let usage = &proxy[i + 1]["usage"];
            // llama.cpp sends no usage in streams: goodput counts with the model's tokenizer.
            assert_eq!(rec["completion_source"], "tokenizer");
            assert_eq!(
                rec["completion_tokens"], usage["completion_tokens"],
                "tokenizer count of the stream vs the server's own count"
            );
            // TTFT, run by run: the proxy never sees the first token after the client, and at
            // least one run agrees within 5 ms. One run alone can be late by a scheduling
            // hiccup of the Python client; an error of goodput's would show in every run.
            let mut runs = vec![(rec, client["ttft_ms"].as_f64().unwrap())];
            for (k, rep) in client["reps"].as_array().unwrap().iter().enumerate() {
                assert_eq!(rep["text"], client["text"], "repeat {k} of case {i} streamed other text");
                let r = &recs[at + 1 + k];
                assert_eq!(r["stream"], true, "record order, repeat {k} of case {i}");
                assert_eq!(r["completion_tokens"], rec["completion_tokens"]);
                runs.push((r, rep["ttft_ms"].as_f64().unwrap()));
            }
            let mut best = f64::INFINITY;
            for (r, cl_ttft) in runs {
                let gp_ttft = r["ttft"].as_f64().unwrap() * 1e3;
                eprintln!(
                    "{} stream: TTFT goodput {gp_ttft:.2} ms, client {cl_ttft:.2} ms; tokens {} ({})",
                    client["kind"], r["completion_tokens"], r["completion_source"]
                );
                assert!(gp_ttft <= cl_ttft + 0.5, "the proxy cannot see the first token after the client");
                best = best.min(cl_ttft - gp_ttft);
            }
            assert!(best <= 5.0, "TTFT: goodput below the client's by {best:.2} ms at best");
        } else {
            assert_eq!(rec["completion_source"], "usage");
            assert_eq!(rec["completion_tokens"], client["usage"]["completion_tokens"]);
            assert_eq!(rec["prompt_tokens"], client["usage"]["prompt_tokens"]);
        }
    }
    assert_eq!(next, n_cases + 1);

    // 3. Cancellation reaches llama.cpp: the abandoned generation stops (its log says so) and
    // the next request is served at once instead of after the rest of a 1,024-token story.
    let cancel = &recs[n_cases + 1];
    assert_eq!(cancel["outcome"], "cancelled");
    let next_ms = seen["cancel"]["next_request_ms"].as_f64().unwrap();
    let tpot = recs[1]["tpot"].as_f64().unwrap();
    assert!(
        next_ms < 200.0 * tpot * 1e3,
        "next request took {next_ms:.0} ms: the server kept generating (TPOT {:.1} ms)",
        tpot * 1e3
    );
    let t = Instant::now();
    loop {
        let log = std::fs::read_to_string(&llama.log).unwrap_or_default();
        if log.contains("Disconnected from client") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "llama.cpp never logged the disconnect:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// llama.cpp's server ignores `n` (one choice comes back): goodput takes that choice, asks for
/// the other two one by one, and sends every later check's re-samples as separate requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistency_resamples_fall_back_to_separate_requests_where_n_is_ignored() {
    let llm = llm_env();
    let llama = start_llama(&llm).await;
    let gp = Goodput::start_logged(
        &format!(
            "backends:\n  - name: llama\n    url: http://127.0.0.1:{}\n    models: [smollm2]\n\
         quality:\n  consistency: {{sample_rate: 1.0, samples: 3, max_tokens: 12, max_token_share: 100}}\n",
            llama.port
        ),
        &[],
        &[("RUST_LOG", "info")],
    );
    let checked = |m: &str| metric(m, "goodput_consistency_checked_total", &[]);
    for (i, q) in ["Name a large river.", "What colour is the sky?"].iter().enumerate() {
        let body = serde_json::json!({"model": "smollm2", "max_tokens": 12, "temperature": 0.7,
            "messages": [{"role": "user", "content": q}]});
        assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", &body.to_string())).await.status, 200);
        // One check at a time: the second starts knowing what the first learnt.
        let t = Instant::now();
        while checked(&gp.metrics().await) < (i + 1) as f64 {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "check {i} did not finish:\n{}",
                gp.metrics().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let m = gp.metrics().await;
    let shadow = |kind: &str| {
        metric(
            &m,
            "goodput_shadow_requests_total",
            &[("backend", "llama"), ("kind", kind), ("outcome", "ok")],
        )
    };
    assert_eq!((shadow("samples_n"), shadow("sample")), (1.0, 2.0 + 3.0), "{m}");
    assert!(gp.log().contains("answered 1 of 3 choices"), "{}", gp.log());
}

/// vLLM and llama.cpp's server behind one goodput: the openai SDK's `models.list()` through
/// goodput gets both servers' models, vLLM's first (the config's order), each entry as the
/// server itself lists it (apart from what each stamps per request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_model_list_names_both_servers_models() {
    let llm = llm_env();
    let llama = start_llama(&llm).await;
    let (_one, vllm) = crate::common::vllm::vllm().await;
    let gp = Goodput::start(&format!(
        "backends:\n  - name: vllm\n    url: {}\n  - name: llama\n    url: http://127.0.0.1:{}\n",
        vllm.url, llama.port
    ));
    let list = |base: String| {
        let python = llm.venv.join("bin/python");
        tokio::task::spawn_blocking(move || {
            let script = "import json, sys, openai\n\
                          c = openai.OpenAI(base_url=sys.argv[1], api_key='none')\n\
                          print(json.dumps([m.model_dump() for m in c.models.list()]))";
            let out = Command::new(python).args(["-c", script, &base]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let mut v: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
            // Stamped per request: `created`, and vLLM's permission entries' ids.
            for m in &mut v {
                m.as_object_mut().unwrap().remove("created");
                for p in m.get_mut("permission").and_then(Value::as_array_mut).into_iter().flatten() {
                    p.as_object_mut().unwrap().retain(|k, _| k != "id" && k != "created");
                }
            }
            v
        })
    };
    let from_vllm = list(format!("{}/v1", vllm.url)).await.unwrap();
    let from_llama = list(format!("http://127.0.0.1:{}/v1", llama.port)).await.unwrap();
    let through = list(format!("http://{}/v1", gp.proxy)).await.unwrap();
    assert_eq!(from_vllm[0]["id"], "smollm2", "{from_vllm:?}");
    assert!(!from_llama.is_empty() && from_llama[0]["id"] != "smollm2", "{from_llama:?}");
    let both: Vec<Value> = from_vllm.into_iter().chain(from_llama).collect();
    assert_eq!(through, both);
}
