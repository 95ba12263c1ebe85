//! The docs stay in sync with the code: the configuration table with the real `consume` flags, the
//! operations guide's quoted log lines with the lines the code writes.

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

/// Every log line quoted in docs/operations.md's tables of ERROR and WARN lines is one the
/// service writes: an operator greps the log for the words the docs give. Each quoted line is
/// taken in pieces between `…` (the docs elide a line's variable parts); every piece of words
/// must stand in the source as it is.
#[test]
fn the_log_lines_the_operations_guide_quotes_are_in_the_code() {
    let root = env!("CARGO_MANIFEST_DIR");
    let guide = std::fs::read_to_string(format!("{root}/docs/operations.md")).unwrap();
    let mut source = String::new();
    let mut dirs = vec![std::path::PathBuf::from(root).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                source.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
    }
    let mut checked = 0;
    let mut in_table = false;
    for line in guide.lines() {
        if line.starts_with('#') {
            in_table = line == "### ERROR lines while running" || line == "#### Other WARN lines";
            continue;
        }
        let Some(row) = line.strip_prefix("| ").filter(|_| in_table) else {
            continue;
        };
        let first_cell = row.split(" | ").next().unwrap();
        for (i, quoted) in first_cell.split('`').enumerate() {
            // Odd pieces are inside backticks; a piece without a space is a field's name.
            if i % 2 == 0 || !quoted.contains(' ') {
                continue;
            }
            for piece in quoted.split('…').map(str::trim).filter(|p| p.len() >= 12) {
                assert!(
                    source.contains(piece),
                    "docs/operations.md quotes a log line the code does not write: {piece:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 25,
        "only {checked} quoted lines found: did the tables move?"
    );
}
