//! The configuration table in docs/configuration.md stays in sync with the real `consume` flags.

use std::process::Command;

#[test]
fn readme_documents_every_consume_flag_and_its_environment_variable() {
    let table = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let help = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args(["consume", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', '<']).next())
        .filter(|f| *f != "help")
        .collect();
    let envs: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim().strip_prefix("[env: "))
        .filter_map(|l| l.split(['=', ']']).next())
        .collect();
    assert!(
        flags.len() > 20 && flags.len() == envs.len(),
        "{flags:?} {envs:?}"
    );
    for (flag, env) in flags.iter().zip(&envs) {
        let row = format!("| `--{flag}` | `{env}` |");
        assert!(
            table.contains(&row),
            "docs/configuration.md lacks the configuration row for --{flag} ({env})"
        );
    }
}
