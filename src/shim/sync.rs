//! Locks that survive a panic.
//!
//! Each RPC runs under `catch_unwind` (see [`crate::server::rpc::server`]): a bug answers INTERNAL
//! instead of killing the supervisor of every container in the pod. A panic while a `Mutex`
//! is held poisons it, and `lock().unwrap()` would then turn one bug into a shim that panics
//! on every later call touching that lock. The data behind our locks stays consistent at
//! every await-free step (no invariant spans a panic point that matters more than a dead
//! shim), so the shim takes the guard of a poisoned lock and goes on.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, WaitTimeoutResult};
use std::time::Duration;

/// `lock()` that ignores poisoning.
pub trait Lock<T> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Lock<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `Condvar` waits that ignore poisoning.
pub trait Wait {
    fn wait_on<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    fn wait_on_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult);
    /// Waits while `condition` holds, at most `timeout`.
    fn wait_on_timeout_while<'a, T, F: FnMut(&mut T) -> bool>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
        condition: F,
    ) -> MutexGuard<'a, T>;
}

impl Wait for Condvar {
    fn wait_on<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }
    fn wait_on_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
    }
    fn wait_on_timeout_while<'a, T, F: FnMut(&mut T) -> bool>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
        condition: F,
    ) -> MutexGuard<'a, T> {
        match self.wait_timeout_while(guard, timeout, condition) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
    }
}
