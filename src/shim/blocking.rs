//! Marks the stretches where a thread waits for something other than a CPU (a child such as
//! runc or a CNI plugin, a contended lifecycle lock), so that the RPC pool can tell a blocked
//! worker from a busy one.
//!
//! The pool ([`crate::server::rpc::server`]) adds a worker beyond its first few only when every busy
//! worker is inside a [`Blocking`] section: a worker that merely waits for a CPU on a loaded
//! machine takes the next call as soon as it runs again, and another thread would only compete
//! for the same CPU. The pool installs an [`Observer`] on each of its worker threads; on any
//! other thread (the reaper, `delete`, tests) a section costs two thread-local accesses.
//!
//! Only waits that can last belong in a section; a section around work that needs the CPU
//! would let the pool grow under load again. Nested sections count once.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use crate::shim::sync::Lock;

/// Told when the thread it was installed on enters and leaves its outermost blocking section.
pub trait Observer: Send + Sync {
    fn blocked(&self);
    fn unblocked(&self);
}

thread_local! {
    static OBSERVER: RefCell<Option<Arc<dyn Observer>>> = const { RefCell::new(None) };
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Reports this thread's blocking sections to `observer` from now on (a pool worker, at its
/// start).
pub fn observe_this_thread(observer: Arc<dyn Observer>) {
    OBSERVER.with_borrow_mut(|o| *o = Some(observer));
}

/// A blocking section: the thread counts as blocked until this is dropped. It stays on the
/// thread that made it (not `Send`).
#[must_use = "the section ends when the guard is dropped"]
pub struct Blocking {
    _same_thread: PhantomData<*const ()>,
}

/// Enters a blocking section; see the module docs.
pub fn blocking() -> Blocking {
    let depth = DEPTH.get();
    DEPTH.set(depth + 1);
    if depth == 0 {
        OBSERVER.with_borrow(|o| {
            if let Some(o) = o {
                o.blocked();
            }
        });
    }
    Blocking {
        _same_thread: PhantomData,
    }
}

impl Drop for Blocking {
    fn drop(&mut self) {
        let depth = DEPTH.get().saturating_sub(1);
        DEPTH.set(depth);
        if depth == 0 {
            OBSERVER.with_borrow(|o| {
                if let Some(o) = o {
                    o.unblocked();
                }
            });
        }
    }
}

/// Locks `m` (ignoring poisoning, as [`Lock::locked`]); the wait counts as blocked only when
/// another thread holds it. For locks held across runc (a container's or a pod's lifecycle).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => PoisonError::into_inner(p),
        Err(TryLockError::WouldBlock) => {
            let _blocked = blocking();
            m.locked()
        }
    }
}

/// Whether this thread is inside a blocking section (tests, debug assertions).
pub fn is_blocked() -> bool {
    DEPTH.get() > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

    #[derive(Default)]
    struct Count {
        now: AtomicIsize,
        entered: AtomicUsize,
    }
    impl Observer for Count {
        fn blocked(&self) {
            self.now.fetch_add(1, Ordering::SeqCst);
            self.entered.fetch_add(1, Ordering::SeqCst);
        }
        fn unblocked(&self) {
            self.now.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn nested_sections_count_once_and_end_with_the_outermost() {
        let count = Arc::new(Count::default());
        let c = count.clone();
        std::thread::spawn(move || {
            observe_this_thread(c.clone());
            assert!(!is_blocked());
            {
                let _a = blocking();
                let _b = blocking();
                assert_eq!(c.now.load(Ordering::SeqCst), 1);
                assert!(is_blocked());
            }
            assert_eq!(c.now.load(Ordering::SeqCst), 0);
            assert!(!is_blocked());
        })
        .join()
        .unwrap();
        assert_eq!(count.entered.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_free_lock_is_no_block_and_a_held_one_is() {
        let count = Arc::new(Count::default());
        let m = Arc::new(Mutex::new(0));
        let (c, m2) = (count.clone(), m.clone());
        let held = m.lock().unwrap();
        let t = std::thread::spawn(move || {
            observe_this_thread(c.clone());
            *lock(&m2) += 1; // waits for the test thread
            *lock(&m2) += 1; // free now
        });
        while count.entered.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        drop(held);
        t.join().unwrap();
        assert_eq!(*m.lock().unwrap(), 2);
        assert_eq!(
            count.entered.load(Ordering::SeqCst),
            1,
            "one contended lock"
        );
        assert_eq!(count.now.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_thread_without_an_observer_is_unaffected() {
        let _b = blocking();
        assert!(is_blocked());
    }
}
