//! The config loader: any text gives a config or precise errors, never a panic; a config it
//! accepts survives a write-and-read-back unchanged (what /admin/config shows is loadable).

use goodput::config::Config;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Config::from_yaml(text) {
        Ok(cfg) => {
            let _ = cfg.redacted();
            let written = serde_yaml_ng::to_string(&cfg).expect("an accepted config serializes");
            let back = Config::from_yaml(&written).expect("a written config loads again");
            assert_eq!(serde_yaml_ng::to_string(&back).unwrap(), written, "round trip changed the config");
        }
        Err(errs) => assert!(!errs.0.is_empty(), "an error without a message"),
    }
}
