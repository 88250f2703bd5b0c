//! [`Slicelet`]: the backend task's side of keyed routing (Slicer's Slicelet idea): which
//! slices this backend task holds, and how many requests arrived for keys it does
//! not hold (misroutes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::{ArcSwapOption, RefCnt};
use futures_util::{Stream, StreamExt};
use http::HeaderName;
use steady_slice::{Assignment, SliceKey};
use steady_tonic::DEFAULT_KEY_HEADER;
use tower::{Layer, Service};

#[derive(Debug, Default)]
struct State {
    assignment: ArcSwapOption<Assignment>,
    keyed: AtomicU64,
    misrouted: AtomicU64,
}

/// What one backend task knows of the assignment, and its misroute counter.
///
/// Clone it freely; clones share state. Feed it assignments with
/// [`Slicelet::follow`] (e.g. from `steady_tonic::watch_assignments`) or
/// [`Slicelet::set_assignment`]; put [`Slicelet::layer`] on the tonic server to count
/// every keyed request it receives.
#[derive(Debug, Clone)]
pub struct Slicelet {
    task: u32,
    state: Arc<State>,
}

impl Slicelet {
    /// The slicelet of backend task `task`.
    pub fn new(task: u32) -> Self {
        Self { task, state: Arc::default() }
    }

    /// Installs `assignment` if it is newer than the one held; returns whether it was.
    ///
    /// Safe to call from many threads at once: the newest generation offered always
    /// wins, and the generation held never goes down.
    pub fn set_assignment(&self, assignment: Assignment) -> bool {
        install_if_newer(&self.state.assignment, assignment, || {})
    }

    /// Follows an assignment source on a task of its own (invalid items are logged and
    /// skipped; e.g. `steady_tonic::watch_assignments`).
    pub fn follow<A, E>(&self, source: A) -> tokio::task::JoinHandle<()>
    where
        A: Stream<Item = Result<Assignment, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let me = self.clone();
        tokio::spawn(async move {
            futures_util::pin_mut!(source);
            while let Some(item) = source.next().await {
                match item {
                    Ok(a) => {
                        me.set_assignment(a);
                    }
                    Err(error) => {
                        tracing::warn!(%error, task = me.task, "slicelet: invalid assignment ignored")
                    }
                }
            }
        })
    }

    /// The generation held (`None` before the first assignment).
    pub fn generation(&self) -> Option<u64> {
        self.state.assignment.load().as_ref().map(|a| a.generation())
    }

    /// Whether this task holds `key` (`None` before the first assignment).
    pub fn holds(&self, key: SliceKey) -> Option<bool> {
        let a = self.state.assignment.load();
        a.as_ref().map(|a| a.slice_for(key).replicas.contains(&self.task))
    }

    /// The start keys of the slices this task holds.
    pub fn held_slices(&self) -> Vec<SliceKey> {
        let a = self.state.assignment.load();
        a.as_ref()
            .map(|a| a.slices().iter().filter(|s| s.replicas.contains(&self.task)).map(|s| s.start).collect())
            .unwrap_or_default()
    }

    /// Records a request with `key`: counts it, and counts a misroute if an assignment
    /// is held and does not give the key to this task. Returns whether it was misrouted.
    pub fn record(&self, key: SliceKey) -> bool {
        self.state.keyed.fetch_add(1, Ordering::Relaxed);
        let misrouted = self.holds(key) == Some(false);
        if misrouted {
            self.state.misrouted.fetch_add(1, Ordering::Relaxed);
        }
        misrouted
    }

    /// Keyed requests recorded.
    pub fn keyed_requests(&self) -> u64 {
        self.state.keyed.load(Ordering::Relaxed)
    }

    /// Keyed requests whose key this task did not hold.
    pub fn misrouted(&self) -> u64 {
        self.state.misrouted.load(Ordering::Relaxed)
    }

    /// A tower layer for the server that records every request's slice key (metadata
    /// `x-slice-key` unless [`SliceletLayer::key_header`] names another, hashed as the
    /// client hashes it).
    pub fn layer(&self) -> SliceletLayer {
        SliceletLayer { slicelet: self.clone(), header: HeaderName::from_static(DEFAULT_KEY_HEADER) }
    }
}

/// Puts `assignment` in `slot` if it is newer than what `slot` holds; returns whether
/// it did. `before_swap` runs between each comparison and its swap (a test puts a
/// racing install there).
fn install_if_newer(
    slot: &ArcSwapOption<Assignment>,
    assignment: Assignment,
    mut before_swap: impl FnMut(),
) -> bool {
    let generation = assignment.generation();
    let new = Some(Arc::new(assignment));
    let mut current = slot.load();
    loop {
        if current.as_ref().is_some_and(|c| c.generation() >= generation) {
            return false;
        }
        before_swap();
        // Swap only if what we compared against is still there: a plain store would let
        // a slower caller overwrite a newer generation installed since its load. When
        // another caller got in first, compare again with what it left.
        let previous = slot.compare_and_swap(&*current, new.clone());
        if RefCnt::as_ptr(&*previous) == RefCnt::as_ptr(&*current) {
            return true;
        }
        current = previous;
    }
}

/// Records the slice key of every request on a [`Slicelet`] (see [`Slicelet::layer`]).
#[derive(Debug, Clone)]
pub struct SliceletLayer {
    slicelet: Slicelet,
    header: HeaderName,
}

impl SliceletLayer {
    /// Reads slice keys from this metadata entry instead of `x-slice-key`: set it to what
    /// the clients' `SteadyChannelBuilder::key_header` names.
    pub fn key_header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }
}

impl<S> Layer<S> for SliceletLayer {
    type Service = SliceletService<S>;

    fn layer(&self, inner: S) -> SliceletService<S> {
        SliceletService { inner, slicelet: self.slicelet.clone(), header: self.header.clone() }
    }
}

/// A server-side service that records keyed requests on its [`Slicelet`], then
/// passes them on unchanged.
#[derive(Debug, Clone)]
pub struct SliceletService<S> {
    inner: S,
    slicelet: Slicelet,
    header: HeaderName,
}

impl<S, B> Service<http::Request<B>> for SliceletService<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        if let Some(value) = req.headers().get(&self.header) {
            self.slicelet.record(SliceKey::of(value.as_bytes()));
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicBool;
    use std::sync::Barrier;

    /// Generations `1..=n` in an order that depends on `seed` (Fisher-Yates over
    /// SplitMix64), so every round races differently.
    fn shuffled(n: u64, seed: u64) -> Vec<u64> {
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut out: Vec<u64> = (1..=n).collect();
        for i in (1..out.len()).rev() {
            out.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        out
    }

    /// Races `THREADS` installers over generations `1..=1000` while an observer checks
    /// that the generation held never goes down; returns the generation left.
    ///
    /// The installers get the generations dealt out of `order` round-robin, each in
    /// ascending order, so that nearly every install is newer than what its thread
    /// last saw: the installers stay in step and their compare-then-store windows
    /// overlap all the time (with a plain shuffle only ~log n installs succeed and the
    /// race almost never shows). The shuffle decides which thread gets which.
    fn race(order: &[u64]) -> Option<u64> {
        const THREADS: usize = 2;
        let slicelet = Slicelet::new(0);
        let start = Barrier::new(THREADS + 1);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let observer = s.spawn(|| {
                start.wait();
                let mut last = 0;
                while !done.load(Ordering::Acquire) {
                    let now = slicelet.generation().unwrap_or(0);
                    assert!(now >= last, "the generation went down from {last} to {now}");
                    last = now;
                }
            });
            let installers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let mut mine: Vec<u64> = order.iter().copied().skip(t).step_by(THREADS).collect();
                    mine.sort_unstable();
                    let (slicelet, start) = (&slicelet, &start);
                    s.spawn(move || {
                        let assignments: Vec<Assignment> =
                            mine.iter().map(|&g| Assignment::single(g, vec![0]).unwrap()).collect();
                        start.wait();
                        for a in assignments {
                            slicelet.set_assignment(a);
                        }
                    })
                })
                .collect();
            for installer in installers {
                installer.join().unwrap();
            }
            done.store(true, Ordering::Release);
            observer.join().unwrap();
        });
        slicelet.generation()
    }

    #[test]
    fn the_newest_generation_wins_when_installs_race() {
        for round in 0..1000 {
            assert_eq!(race(&shuffled(1000, round)), Some(1000), "round {round}: an older generation won");
        }
    }

    #[test]
    fn an_install_that_loses_the_race_leaves_the_newer_generation() {
        let slot = ArcSwapOption::empty();
        let single = |g| Assignment::single(g, vec![0]).unwrap();
        // Generation 5 compares against nothing, then 7 lands before 5 is swapped in.
        let mut racer = Some(single(7));
        let installed = install_if_newer(&slot, single(5), || {
            if let Some(newer) = racer.take() {
                assert!(install_if_newer(&slot, newer, || {}));
            }
        });
        assert!(!installed, "5 is older than the 7 that got in first");
        assert_eq!(slot.load().as_ref().map(|a| a.generation()), Some(7));
        // And a newer one racing an older one: both land, the newer last.
        let mut racer = Some(single(8));
        assert!(install_if_newer(&slot, single(9), || {
            if let Some(older) = racer.take() {
                assert!(install_if_newer(&slot, older, || {}));
            }
        }));
        assert_eq!(slot.load().as_ref().map(|a| a.generation()), Some(9));
    }

    #[test]
    fn an_older_generation_is_refused() {
        let slicelet = Slicelet::new(0);
        assert!(slicelet.set_assignment(Assignment::single(2, vec![0]).unwrap()));
        assert!(!slicelet.set_assignment(Assignment::single(2, vec![1]).unwrap()));
        assert!(!slicelet.set_assignment(Assignment::single(1, vec![1]).unwrap()));
        assert_eq!((slicelet.generation(), slicelet.holds(SliceKey(0))), (Some(2), Some(true)));
    }
}
