//! The container image runs the binary: every shared library it loads is one the runtime base
//! (`gcr.io/distroless/cc-debian12`, the Dockerfile's last stage) has — glibc, libgcc, libstdc++,
//! libgomp and OpenSSL 3. librdkafka linked the system zlib (`libz.so.1`), which is none of its
//! packages (distroless's cc-debian13 has no zlib at all; reports on cc-debian12 differ): where it
//! is missing the binary does not start, and every pod crash-loops. zlib is built in now
//! (rdkafka's `libz-static`).

use std::process::Command;

/// The libraries the runtime base provides (its packages libc6, libgcc-s1, libstdc++6, libgomp1
/// and libssl3), and the loader's own entries.
const IN_THE_IMAGE: [&str; 13] = [
    "linux-vdso.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libgomp.so.1",
    "libssl.so.3",
    "libcrypto.so.3",
];

#[test]
fn the_binary_needs_no_shared_library_the_runtime_image_lacks() {
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap();
    let runtime = dockerfile
        .lines()
        .rfind(|l| l.starts_with("FROM "))
        .unwrap();
    assert!(
        runtime.contains("gcr.io/distroless/cc-debian12"),
        "the runtime base changed ({runtime}): check its libraries and this list"
    );
    let ldd = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_replay-ingest"))
        .output()
        .expect("ldd");
    assert!(ldd.status.success(), "{ldd:?}");
    let needed: Vec<String> = String::from_utf8(ldd.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|name| name.rsplit('/').next().unwrap_or(name).to_owned())
        .collect();
    assert!(needed.iter().any(|n| n == "libc.so.6"), "{needed:?}");
    let missing: Vec<&String> = needed
        .iter()
        .filter(|n| !IN_THE_IMAGE.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not in the runtime image: {missing:?} (all: {needed:?})"
    );
}
