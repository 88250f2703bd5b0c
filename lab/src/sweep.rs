//! Running many independent measurements on all cores, with a progress bar.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

use indicatif::{ProgressBar, ProgressStyle};

/// How a sweep runs: worker threads and whether to show progress.
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    threads: usize,
    progress: bool,
}

impl Sweep {
    /// `threads` workers (`None`: one per core), with a progress bar on a terminal.
    pub fn new(threads: Option<usize>) -> Self {
        let threads =
            threads.unwrap_or_else(|| thread::available_parallelism().map_or(1, usize::from)).max(1);
        Self { threads, progress: true }
    }

    /// No progress bar even on a terminal (tests).
    pub fn quiet(mut self) -> Self {
        self.progress = false;
        self
    }

    /// The number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// `f` applied to every item, in the items' order, computed by the workers.
    ///
    /// Workers take the next unclaimed item from a shared counter, so a few slow items
    /// do not leave cores idle. The bar (labelled `label`) draws on stderr only when it
    /// is a terminal: piped output stays clean.
    ///
    /// # Errors
    ///
    /// The first error any item returned (the sweep stops claiming new items).
    pub fn map<T, R, E>(
        &self,
        label: &str,
        items: &[T],
        f: impl Fn(&T) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E>
    where
        T: Sync,
        R: Send,
        E: Send,
    {
        let bar = if self.progress { ProgressBar::new(items.len() as u64) } else { ProgressBar::hidden() };
        bar.set_style(
            ProgressStyle::with_template("{prefix:>28} [{bar:40}] {pos}/{len} {elapsed}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_owned());
        let next = AtomicUsize::new(0);
        let failed = Mutex::new(None);
        let mut results: Vec<(usize, R)> = thread::scope(|scope| {
            let workers: Vec<_> = (0..self.threads.min(items.len()).max(1))
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= items.len() {
                                break;
                            }
                            match f(&items[i]) {
                                Ok(r) => done.push((i, r)),
                                Err(e) => {
                                    // Stop everyone: no item past the end is claimed.
                                    next.store(items.len(), Ordering::Relaxed);
                                    failed.lock().expect("not poisoned").get_or_insert(e);
                                    break;
                                }
                            }
                            bar.inc(1);
                        }
                        done
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().expect("sweep worker panicked")).collect()
        });
        bar.finish_and_clear();
        if let Some(e) = failed.into_inner().expect("not poisoned") {
            return Err(e);
        }
        results.sort_unstable_by_key(|(i, _)| *i);
        Ok(results.into_iter().map(|(_, r)| r).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_item_order() {
        let items: Vec<u64> = (0..500).collect();
        let out = Sweep::new(Some(3)).quiet().map("t", &items, |&x| Ok::<_, ()>(x * x)).unwrap();
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
    }

    #[test]
    fn an_error_stops_the_sweep() {
        let items: Vec<u64> = (0..100).collect();
        let out = Sweep::new(Some(2)).quiet().map("t", &items, |&x| if x == 42 { Err(x) } else { Ok(x) });
        assert_eq!(out, Err(42));
    }
}
