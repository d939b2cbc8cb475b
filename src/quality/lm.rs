//! The reference language model: an ONNX causal LM run with ONNX Runtime (`ort`, loaded
//! dynamically from libonnxruntime.so), and its tokenizer.json.
//!
//! A model directory holds `model.onnx` (inputs `input_ids`, `attention_mask`, optionally
//! `position_ids`; output `token_logprobs` `[B, S]` as scripts/models/gguf_to_onnx.py makes, or
//! `logits` `[B, S, V]` as optimum exports), `tokenizer.json`, and optionally `chat_template.jinja`
//! and `special_tokens.json` (`bos_token_id`) or Hugging Face's `tokenizer_config.json`.
//!
//! `Session::run` takes `&mut self`: every scoring thread loads its own `ReferenceLm`.

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{OutputSelector, RunOptions, Session};
use ort::value::Tensor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tokenizers::Tokenizer;

use crate::config::Device;
use crate::quality::template::ChatTemplate;

/// A scorer failure, as text: ort's builder errors are not `Send`, so they are rendered where
/// they happen.
#[derive(Debug, Clone, PartialEq)]
pub struct LmError(pub String);

impl std::fmt::Display for LmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LmError {}

impl<R> From<ort::Error<R>> for LmError {
    fn from(e: ort::Error<R>) -> Self {
        LmError(e.to_string())
    }
}

fn err(msg: impl Into<String>) -> LmError {
    LmError(msg.into())
}

static ENV: OnceLock<Result<Environment, LmError>> = OnceLock::new();
/// The library ENV was loaded from: CUDA's libraries may sit beside it.
#[cfg(feature = "cuda")]
static ORT_LIB: OnceLock<PathBuf> = OnceLock::new();

/// Load ONNX Runtime once per process from `lib`, else from ORT_DYLIB_PATH. A missing or wrong
/// library is an error with the path in it, never a panic.
pub fn environment(lib: Option<&Path>) -> Result<&'static Environment, LmError> {
    ENV.get_or_init(|| {
        let path = lib
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from))
            .ok_or_else(|| {
                err("no ONNX Runtime library: set quality.perplexity.onnxruntime (or --onnxruntime) or \
                     ORT_DYLIB_PATH to libonnxruntime.so; scripts/setup-onnxruntime.sh installs one")
            })?;
        if !path.is_file() {
            return Err(err(format!("ONNX Runtime library {} does not exist", path.display())));
        }
        #[cfg(feature = "cuda")]
        let _ = ORT_LIB.set(path.clone());
        let builder = ort::init_from(&path)
            .map_err(|e| err(format!("cannot load ONNX Runtime from {}: {e}", path.display())))?;
        builder.with_name("goodput").build().map_err(LmError::from)
    })
    .as_ref()
    .map_err(Clone::clone)
}

#[derive(Debug, Clone)]
pub struct LmOptions {
    pub onnxruntime: Option<PathBuf>,
    pub device: Device,
    pub allow_cpu_fallback: bool,
    pub intra_op_threads: usize,
}

impl Default for LmOptions {
    fn default() -> Self {
        LmOptions { onnxruntime: None, device: Device::Cpu, allow_cpu_fallback: false, intra_op_threads: 1 }
    }
}

/// What every thread shares: the tokenizer, the template and the token ids that frame a text.
pub struct LmAssets {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// The token a text is conditioned on when nothing precedes it (BOS; SmolLM2's is
    /// `<|im_start|>`).
    pub prefix_id: u32,
}

impl LmAssets {
    pub fn load(dir: &Path) -> Result<LmAssets, LmError> {
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| err(format!("cannot load {}/tokenizer.json: {e}", dir.display())))?;
        let template = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
        let special = read_json(&dir.join("special_tokens.json"));
        let hf = read_json(&dir.join("tokenizer_config.json"));
        let token_text = |key: &str| -> Option<String> {
            let v = hf.as_ref()?.get(key)?;
            v.as_str().or_else(|| v.get("content").and_then(|c| c.as_str())).map(str::to_string)
        };
        let prefix_id = special
            .as_ref()
            .and_then(|s| s.get("bos_token_id")?.as_u64())
            .map(|v| v as u32)
            .or_else(|| token_text("bos_token").and_then(|t| tokenizer.token_to_id(&t)))
            .or_else(|| token_text("eos_token").and_then(|t| tokenizer.token_to_id(&t)))
            .or_else(|| ["<|endoftext|>", "<s>", "</s>"].iter().find_map(|t| tokenizer.token_to_id(t)))
            .ok_or_else(|| {
                err(format!(
                    "no BOS token known for {}: add special_tokens.json with bos_token_id",
                    dir.display()
                ))
            })?;
        let name = |id: u32| tokenizer.id_to_token(id).unwrap_or_default();
        let eos = special
            .as_ref()
            .and_then(|s| s.get("eos_token_id")?.as_u64())
            .map(|v| name(v as u32))
            .or_else(|| token_text("eos_token"))
            .unwrap_or_default();
        let template = ChatTemplate::new(template, name(prefix_id), eos)
            .map_err(|e| err(format!("chat template of {}: {e}", dir.display())))?;
        Ok(LmAssets { tokenizer, template, prefix_id })
    }

    /// Token ids of `text`, special tokens in the text recognised, nothing added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, LmError> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| err(format!("tokenizer: {e}")))
    }
}

fn read_json(p: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

pub struct ReferenceLm {
    session: Session,
    has_position_ids: bool,
    /// The model computes next-token log-probabilities itself; else they come from `logits`.
    has_token_logprobs: bool,
    select: RunOptions<ort::session::HasSelectedOutputs>,
    pub assets: Arc<LmAssets>,
    pub device: Device,
}

impl ReferenceLm {
    pub fn load(dir: &Path, assets: Arc<LmAssets>, opts: &LmOptions) -> Result<ReferenceLm, LmError> {
        let env = environment(opts.onnxruntime.as_deref())?;
        let model = dir.join("model.onnx");
        let (session, device) = match open(env, &model, opts, opts.device) {
            Ok(s) => (s, opts.device),
            Err(e) if opts.device != Device::Cpu && opts.allow_cpu_fallback => {
                tracing::warn!(error = %e, "perplexity model: {:?} unavailable, falling back to the CPU", opts.device);
                (open(env, &model, opts, Device::Cpu)?, Device::Cpu)
            }
            Err(e) => return Err(e),
        };
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        for required in ["input_ids", "attention_mask"] {
            if !inputs.contains(&required) {
                return Err(err(format!("{}: the model has no `{required}` input", model.display())));
            }
        }
        if let Some(other) =
            inputs.iter().find(|n| !["input_ids", "attention_mask", "position_ids"].contains(n))
        {
            return Err(err(format!(
                "{}: unsupported input `{other}` (export the model without past key values)",
                model.display()
            )));
        }
        let outputs: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
        let has_token_logprobs = outputs.contains(&"token_logprobs");
        if !has_token_logprobs && !outputs.contains(&"logits") {
            return Err(err(format!(
                "{}: the model has neither `token_logprobs` nor `logits`",
                model.display()
            )));
        }
        let out = if has_token_logprobs { "token_logprobs" } else { "logits" };
        let select = RunOptions::new()?.with_outputs(OutputSelector::no_default().with(out));
        Ok(ReferenceLm {
            has_position_ids: inputs.contains(&"position_ids"),
            has_token_logprobs,
            session,
            select,
            assets,
            device,
        })
    }

    /// For each row, log p(row[i+1] | row[..=i]) for i in 0..len-1. Rows are right-padded into
    /// one batch (a causal model's outputs at real positions do not see the padding).
    pub fn next_token_logprobs(&mut self, rows: &[&[u32]]) -> Result<Vec<Vec<f32>>, LmError> {
        let b = rows.len();
        let s = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        if b == 0 || s < 2 {
            return Ok(rows.iter().map(|_| Vec::new()).collect());
        }
        let mut ids = vec![0i64; b * s];
        let mut mask = vec![0i64; b * s];
        let mut pos = if self.has_position_ids { vec![0i64; b * s] } else { Vec::new() };
        for (r, row) in rows.iter().enumerate() {
            for (i, &t) in row.iter().enumerate() {
                ids[r * s + i] = i64::from(t);
                mask[r * s + i] = 1;
                if let Some(p) = pos.get_mut(r * s + i) {
                    *p = i as i64;
                }
            }
        }
        let shape = [b, s];
        let mut inputs = ort::inputs![
            "input_ids" => Tensor::from_array((shape, ids))?,
            "attention_mask" => Tensor::from_array((shape, mask))?,
        ];
        if self.has_position_ids {
            inputs.push(("position_ids".into(), Tensor::from_array((shape, pos))?.into()));
        }
        let outputs = self.session.run_with_options(inputs, &self.select)?;
        if self.has_token_logprobs {
            let (_, data) = outputs["token_logprobs"].try_extract_tensor::<f32>()?;
            return Ok(rows
                .iter()
                .enumerate()
                .map(|(r, row)| data[r * s..r * s + row.len() - 1].to_vec())
                .collect());
        }
        let (shape, data) = outputs["logits"].try_extract_tensor::<f32>()?;
        let v = shape.get(2).copied().unwrap_or(0) as usize;
        if v == 0 || data.len() != b * s * v {
            return Err(err("logits output has an unexpected shape"));
        }
        Ok(rows
            .iter()
            .enumerate()
            .map(|(r, row)| {
                (0..row.len() - 1)
                    .map(|i| {
                        let l = &data[(r * s + i) * v..(r * s + i + 1) * v];
                        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let lse = l.iter().map(|&x| f64::from(x - max).exp()).sum::<f64>().ln() as f32 + max;
                        l[row[i + 1] as usize] - lse
                    })
                    .collect()
            })
            .collect())
    }
}

/// The session options every goodput model uses: full graph optimisation, `intra_op_threads`
/// threads, and no spinning (spinning threads would take CPU from the proxy while idle).
pub(crate) fn session_builder(
    env: &Environment,
    intra_op_threads: usize,
) -> Result<ort::session::builder::SessionBuilder, LmError> {
    Ok(Session::builder(env)?
        .with_optimization_level(GraphOptimizationLevel::All)?
        .with_intra_threads(intra_op_threads)?
        .with_intra_op_spinning(false)?)
}

/// The CUDA 13 libraries onnxruntime's CUDA provider links to, in load order.
#[cfg(feature = "cuda")]
const CUDA_LIBRARIES: [&str; 4] =
    ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libcurand.so.10"];

/// Where CUDA's libraries sit beside libonnxruntime.so (`ORT_GPU=1 scripts/setup-onnxruntime.sh`
/// and the CUDA image put them there), load them first, by path and globally: onnxruntime loads
/// its CUDA provider by path, and the provider then finds them loaded by name. Its own search
/// would miss them (it has no RUNPATH), so without this they must be on LD_LIBRARY_PATH.
#[cfg(feature = "cuda")]
fn preload_cuda_libraries(dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        for name in CUDA_LIBRARIES {
            let path = dir.join(name);
            if !path.is_file() {
                continue;
            }
            let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { continue };
            // SAFETY: loads a shared library by path; the handle is never closed, so the library
            // stays mapped for the life of the process, as the provider that links to it needs.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            if handle.is_null() {
                // SAFETY: dlerror returns a thread-local C string (or null) describing the failure.
                let why = unsafe { libc::dlerror() };
                let why = if why.is_null() {
                    String::new()
                } else {
                    // SAFETY: non-null dlerror results are NUL-terminated strings.
                    unsafe { std::ffi::CStr::from_ptr(why) }.to_string_lossy().into_owned()
                };
                tracing::warn!(library = %path.display(), error = %why, "could not load a CUDA library");
            }
        }
    });
}

fn open(env: &Environment, model: &Path, opts: &LmOptions, device: Device) -> Result<Session, LmError> {
    let mut b = session_builder(env, opts.intra_op_threads)?;
    match device {
        Device::Cpu => {}
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => {
            if let Some(dir) = ORT_LIB.get().and_then(|p| p.parent()) {
                preload_cuda_libraries(dir);
            }
            b = b
                .with_execution_providers([ort::ep::CUDA::default()
                    .with_device_id(n)
                    .build()
                    .error_on_failure()])
                .map_err(|e| {
                    err(format!(
                        "device cuda:{n}: {e} (the CUDA provider needs the NVIDIA driver's libcuda.so.1, and \
                         onnxruntime-gpu's libonnxruntime.so with CUDA 13's runtime, cuBLAS and \
                         cuRAND beside it or on LD_LIBRARY_PATH: ORT_GPU=1 \
                         scripts/setup-onnxruntime.sh installs those)"
                    ))
                })?;
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => {
            return Err(err(
                "device cuda: this goodput was built without the `cuda` feature (cargo build --features cuda)",
            ));
        }
    }
    b.commit_from_file(model).map_err(|e| err(format!("cannot load {}: {e}", model.display())))
}
