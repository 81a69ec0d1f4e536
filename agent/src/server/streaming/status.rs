//! How a remote command ended, and how it is written on the error
//! channel: the v4/v5 protocols carry a metav1.Status in JSON (the exit
//! code as a cause of reason `ExitCode`, which kubectl turns into its own
//! exit code); v1 to v3 carry the error text, nothing on success (pure).

use serde_json::{Value, json};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// The command exited with this non-zero code.
    ExitCode(i32),
    /// Running the command failed (not found, runtime error...).
    Error(String),
}

/// The Status JSON of the v4 and v5 protocols.
pub fn status_json(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Success => json!({"metadata": {}, "status": "Success"}),
        Outcome::ExitCode(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Outcome::Error(msg) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("Internal error occurred: error executing command in container: {msg}"),
            "reason": "InternalError",
            "details": {"causes": [{"message": format!("error executing command in container: {msg}")}]},
            "code": 500,
        }),
    }
}

/// What goes on the error channel for a client speaking `version` (4 or
/// 5: JSON; older: the error text, nothing on success).
pub fn encode(outcome: &Outcome, version: u8) -> Vec<u8> {
    if version >= 4 {
        return serde_json::to_vec(&status_json(outcome)).unwrap_or_default();
    }
    match outcome {
        Outcome::Success => vec![],
        other => status_json(other)["message"].as_str().unwrap_or_default().as_bytes().to_vec(),
    }
}

/// Reads what a runtime's stream server wrote on the error stream of a
/// v4 session. Nothing at all means success (as client-go reads it).
pub fn decode_v4(bytes: &[u8]) -> Outcome {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Outcome::Success;
    }
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return Outcome::Error(String::from_utf8_lossy(bytes).trim().to_owned());
    };
    if v["status"] == "Success" {
        return Outcome::Success;
    }
    if v["reason"] == "NonZeroExitCode"
        && let Some(code) = v["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse::<i32>().ok())
    {
        return Outcome::ExitCode(code);
    }
    let msg = v["message"].as_str().unwrap_or("the runtime reported a failure without a message");
    // Not wrapped twice when re-encoded.
    let msg = msg
        .trim_start_matches("Internal error occurred: ")
        .trim_start_matches("error executing command in container: ");
    Outcome::Error(msg.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_status_format() {
        let v = status_json(&Outcome::ExitCode(3));
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0], json!({"reason": "ExitCode", "message": "3"}));
        assert_eq!(encode(&Outcome::Success, 5), br#"{"metadata":{},"status":"Success"}"#);
        assert!(encode(&Outcome::Success, 2).is_empty());
        let text = String::from_utf8(encode(&Outcome::Error("no such file".into()), 3)).unwrap();
        assert_eq!(text, "Internal error occurred: error executing command in container: no such file");
    }

    #[test]
    fn runtime_statuses_read_back() {
        for o in [Outcome::Success, Outcome::ExitCode(3), Outcome::ExitCode(-1), Outcome::Error("boom".into())] {
            assert_eq!(decode_v4(&encode(&o, 4)), o);
        }
        assert_eq!(decode_v4(b""), Outcome::Success);
        assert_eq!(decode_v4(b"not json"), Outcome::Error("not json".into()));
        // containerd's own wording for a missing binary.
        let c = br#"{"metadata":{},"status":"Failure","message":"failed to exec in container: starting container process caused: exec: \"nope\": executable file not found in $PATH: unknown","reason":"InternalError","code":500}"#;
        assert!(matches!(decode_v4(c), Outcome::Error(m) if m.contains("executable file not found")));
    }
}
