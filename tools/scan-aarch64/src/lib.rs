//! `src/recording/scan.rs`, compiled on its own so that its tests run on aarch64 (NEON masks)
//! without cross-compiling the service's C dependencies.

#[path = "../../../src/recording/scan.rs"]
pub mod scan;
