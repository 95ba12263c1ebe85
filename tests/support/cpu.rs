//! Who may keep a core busy while a test measures the test process's CPU.
//!
//! A test that asserts an idle pipeline costs no CPU reads `/proc/self/stat`: the whole process,
//! every test running in it included. It takes the least of several windows, so a short test
//! beside it does not count; a test that computes for seconds would (the memory-bound property
//! tests compute for 10 to 30 s in a debug build, and once made the idle pipeline look like 79 %
//! of a core). So the measuring test holds [`measures_cpu`] and runs alone; tests that keep a core
//! busy for seconds, or run pipelines of their own in this process, hold [`keeps_cpu_busy`] or
//! [`shares_cpu`] and run side by side with each other.

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static CPU: RwLock<()> = RwLock::const_new(());

/// Held by a test that measures the process's CPU: no busy test runs meanwhile.
pub async fn measures_cpu() -> RwLockWriteGuard<'static, ()> {
    CPU.write().await
}

/// Held by an async test whose own work runs in this process (a pipeline): any number at once.
pub async fn shares_cpu() -> RwLockReadGuard<'static, ()> {
    CPU.read().await
}

/// Held by a synchronous test that computes for seconds: any number at once.
pub fn keeps_cpu_busy() -> RwLockReadGuard<'static, ()> {
    CPU.blocking_read()
}
