//! Writes the crafted messages of `tests/support/hostile.rs` as `DIR/NAME.msgpack` (one file per
//! message value), for `scripts/hostile-rss.sh` and for trying them by hand.
//!
//! Run: `cargo run --release --example make_hostile_fixtures -- DIR`

#[path = "../tests/support/hostile.rs"]
mod hostile;

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: make_hostile_fixtures DIR");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the output directory");
    for message in hostile::all() {
        let path = dir.join(format!("{}.msgpack", message.name));
        std::fs::write(&path, &message.value).expect("write a fixture");
        let expected = message.invalid_reason.unwrap_or("valid");
        println!("{}\t{}\t{}", path.display(), message.value.len(), expected);
    }
}
