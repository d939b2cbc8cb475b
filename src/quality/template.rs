//! Rendering a chat request's messages the way the reference model was trained to read them:
//! its Hugging Face chat template (Jinja, via minijinja), or ChatML when the model ships none.

use minijinja::{Environment, Error, ErrorKind, context};
use serde_json::Value;

/// ChatML, the template SmolLM2 and many others use (without a default system prompt).
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + \
                      message['content'] + '<|im_end|>\n' }}{% endfor %}\
                      {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    pub fn new(source: Option<String>, bos: String, eos: String) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        // Hugging Face templates call raise_exception() to reject what they cannot render.
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.unwrap_or_else(|| CHATML.to_string()))?;
        Ok(ChatTemplate { env, bos, eos })
    }

    /// The prompt text for `messages` (an OpenAI `messages` array), ending where the assistant's
    /// reply begins. Content given as parts keeps only its text parts.
    pub fn render(&self, messages: &Value) -> Result<String, Error> {
        let msgs: Vec<Value> = messages
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|m| {
                        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
                        serde_json::json!({"role": role, "content": content_text(m.get("content"))})
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.env.get_template("chat")?.render(context! {
            messages => minijinja::value::Serde(&msgs),
            add_generation_prompt => true,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        })
    }
}

/// A message's content as text: a string, or the `text` of its parts joined.
pub fn content_text(c: Option<&Value>) -> String {
    match c {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_template_renders_like_transformers() {
        // SmolLM2-135M-Instruct's template (tokenizer.chat_template in its GGUF).
        let src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let t = ChatTemplate::new(Some(src.into()), "<|im_start|>".into(), "<|im_end|>".into()).unwrap();
        let out = t.render(&serde_json::json!([{"role": "user", "content": "Hi"}])).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let parts = serde_json::json!([{"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]}]);
        assert_eq!(
            t.render(&parts).unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn chatml_default_and_raise_exception() {
        let t = ChatTemplate::new(None, String::new(), String::new()).unwrap();
        let out = t.render(&serde_json::json!([{"role": "user", "content": "x"}])).unwrap();
        assert_eq!(out, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
        let t = ChatTemplate::new(
            Some("{{ raise_exception('no system role') }}".into()),
            String::new(),
            String::new(),
        )
        .unwrap();
        assert!(t.render(&serde_json::json!([])).unwrap_err().to_string().contains("no system role"));
    }
}
