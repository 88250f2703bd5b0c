//! A member's gate: which picks may choose it, in one atomic word.
//!
//! A member is open to every pick, in slow start (a pick that draws it takes it with
//! its share's chance), on probation (one request, the probe, goes first), or broken
//! (no pick takes it, unless nothing else is there). All of that is one word, so that
//! the pick's fast path reads one value per member to know it may take it: open is
//! one comparison. How the states are packed into the word is this module's own.

use std::sync::atomic::{AtomicU32, Ordering};

use steady_subset::prng::SplitMix64;

/// The word of a fully open gate; a slow-start share is a word below it (its parts of
/// this many), the other states are words above it.
const FULL: u32 = 1 << 16;
const PROBE_WAITING: u32 = FULL + 1;
const PROBE_SENT: u32 = FULL + 2;
const BROKEN: u32 = FULL + 3;

/// A share of the picks that draw a member: from none to all, in steps of 1/65536.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Share(u32);

impl Share {
    /// Every pick that draws the member takes it.
    pub(crate) const FULL: Share = Share(FULL);
    /// The least share above none.
    pub(crate) const LEAST: Share = Share(1);

    /// `fraction` of the picks, rounded down to the share's step, at most [`Share::FULL`]
    /// (none for a fraction at or below zero, or NaN).
    pub(crate) fn of(fraction: f64) -> Self {
        Share(((fraction * f64::from(FULL)) as u32).min(FULL))
    }

    /// The share in percent, rounded down.
    pub(crate) fn percent(self) -> u8 {
        (u64::from(self.0) * 100 / u64::from(FULL)) as u8
    }

    /// Draws whether a pick takes the member: true with this share's chance.
    #[inline]
    pub(crate) fn admits(self, rng: &mut SplitMix64) -> bool {
        rng.below(u64::from(FULL)) < u64::from(self.0)
    }
}

/// What a gate said when it was read: a copy of its word, decoded by its methods.
///
/// The states are the associated constants and [`GateState::slow_start`]; a full
/// slow-start share is [`GateState::OPEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateState(u32);

impl GateState {
    /// Open to every pick.
    pub(crate) const OPEN: GateState = GateState(FULL);
    /// On probation, its one request (the probe) not yet sent.
    pub(crate) const PROBE_WAITING: GateState = GateState(PROBE_WAITING);
    /// On probation, its probe in flight: held back until it has an outcome.
    pub(crate) const PROBE_SENT: GateState = GateState(PROBE_SENT);
    /// Its connection failed: no pick takes it, unless nothing else is there.
    pub(crate) const BROKEN: GateState = GateState(BROKEN);

    /// In slow start at `share` (open at a full share).
    pub(crate) const fn slow_start(share: Share) -> Self {
        GateState(share.0)
    }

    /// Whether every pick may take it.
    #[inline(always)]
    pub(crate) fn is_open(self) -> bool {
        self.0 == FULL
    }

    /// Whether its connection failed.
    #[inline(always)]
    pub(crate) fn is_broken(self) -> bool {
        self.0 == BROKEN
    }

    /// Whether it waits for its probe to be sent.
    #[inline(always)]
    pub(crate) fn is_probe_waiting(self) -> bool {
        self.0 == PROBE_WAITING
    }

    /// Whether it serves its share of picks: open, or in slow start (not on probation,
    /// not broken).
    #[inline(always)]
    pub(crate) fn serves(self) -> bool {
        self.0 <= FULL
    }

    /// Its share when in slow start (below a full share); `None` when open, on
    /// probation or broken.
    #[inline(always)]
    pub(crate) fn slow_start_share(self) -> Option<Share> {
        (self.0 < FULL).then_some(Share(self.0))
    }
}

/// The state by name, for logs (the `gate` field of the control task's events): the
/// packing stays private to this module.
impl std::fmt::Display for GateState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::OPEN => f.write_str("open"),
            Self::PROBE_WAITING => f.write_str("probe waiting"),
            Self::PROBE_SENT => f.write_str("probe sent"),
            Self::BROKEN => f.write_str("broken"),
            state => match state.slow_start_share() {
                Some(share) => write!(f, "slow start at {}%", share.percent()),
                None => write!(f, "unknown ({:#x})", state.0),
            },
        }
    }
}

/// The gate of one member: its [`GateState`] in one atomic word.
///
/// Every access is `Relaxed`: the gate orders nothing else. A pick that reads a state
/// a moment old only routes one request as the state before would have; the
/// transitions that must happen once (claiming the probe, ending probation) are
/// compare-and-swaps on the word itself.
#[derive(Debug)]
pub(crate) struct Gate(AtomicU32);

impl Gate {
    pub(crate) fn new(state: GateState) -> Self {
        Gate(AtomicU32::new(state.0))
    }

    /// The state now: one atomic load.
    #[inline(always)]
    pub(crate) fn read(&self) -> GateState {
        GateState(self.0.load(Ordering::Relaxed))
    }

    /// Sets the share of picks that may choose the member (slow start; a full share
    /// opens it). A member on probation keeps its probation (its slow start starts
    /// after the probe), and a broken one stays broken.
    pub(crate) fn set_share(&self, share: Share) {
        debug_assert!(share <= Share::FULL, "a share is at most full: {share:?}");
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| (g <= FULL).then_some(share.0));
    }

    /// Claims the probe of a member on probation: true for the one request that then
    /// goes.
    #[inline]
    pub(crate) fn try_probe(&self) -> bool {
        self.swap_if(GateState::PROBE_WAITING, GateState::PROBE_SENT)
    }

    /// The probe served: ends probation, opening to `opened`, whether the probe is
    /// still counted in flight or its guard already freed it (an outcome reported after
    /// the response's head). True for the one outcome that ended it.
    pub(crate) fn probe_served(&self, opened: GateState) -> bool {
        debug_assert!(opened.serves(), "probation opens to a share: {opened:?}");
        self.swap_if(GateState::PROBE_SENT, opened) || self.swap_if(GateState::PROBE_WAITING, opened)
    }

    /// The probe failed or was given up on: the next pick that draws the member
    /// probes again (nothing when no probe is in flight).
    #[inline]
    pub(crate) fn free_probe(&self) {
        // Read first: every request that leaves a member idle comes here, and a plain
        // load is cheaper than the compare-and-swap that almost always fails.
        if self.0.load(Ordering::Relaxed) == GateState::PROBE_SENT.0 {
            self.swap_if(GateState::PROBE_SENT, GateState::PROBE_WAITING);
        }
    }

    /// The connection failed: no pick takes the member from now on.
    pub(crate) fn set_broken(&self) {
        self.0.store(GateState::BROKEN.0, Ordering::Relaxed);
    }

    fn swap_if(&self, from: GateState, to: GateState) -> bool {
        self.0.compare_exchange(from.0, to.0, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_logs_by_name_not_by_its_packed_word() {
        assert_eq!(GateState::OPEN.to_string(), "open");
        assert_eq!(GateState::PROBE_WAITING.to_string(), "probe waiting");
        assert_eq!(GateState::PROBE_SENT.to_string(), "probe sent");
        assert_eq!(GateState::BROKEN.to_string(), "broken");
        let quarter = GateState::slow_start(Share::of(0.25));
        assert_eq!(quarter.to_string(), format!("slow start at {}%", Share::of(0.25).percent()));
    }

    #[test]
    fn a_share_sets_slow_start_and_a_full_one_opens_but_never_ends_probation() {
        let gate = Gate::new(GateState::OPEN);
        gate.set_share(Share::of(0.25));
        assert_eq!(gate.read().slow_start_share().map(Share::percent), Some(25));
        assert!(gate.read().serves() && !gate.read().is_open());
        gate.set_share(Share::FULL);
        assert!(gate.read().is_open());
        let gate = Gate::new(GateState::PROBE_WAITING);
        gate.set_share(Share::FULL);
        assert!(gate.read().is_probe_waiting());
        assert!(gate.try_probe() && !gate.try_probe(), "one probe");
        gate.free_probe();
        assert!(gate.try_probe());
        assert!(gate.probe_served(GateState::slow_start(Share::LEAST)));
        assert!(!gate.probe_served(GateState::OPEN), "once");
        assert_eq!(gate.read().slow_start_share(), Some(Share::LEAST));
        gate.set_broken();
        gate.set_share(Share::FULL);
        assert!(gate.read().is_broken() && !gate.read().serves());
        // A success reported after the probe was freed ends probation too.
        let gate = Gate::new(GateState::PROBE_WAITING);
        assert!(gate.probe_served(GateState::OPEN) && gate.read() == GateState::OPEN);
    }

    #[test]
    fn shares_are_clamped_to_full_and_rounded_down() {
        assert_eq!(Share::of(2.0), Share::FULL);
        assert_eq!(Share::of(-1.0), Share(0));
        assert_eq!(Share::of(0.5).percent(), 50);
        assert_eq!(GateState::slow_start(Share::FULL), GateState::OPEN);
    }
}
