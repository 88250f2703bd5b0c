//! Slow start: members that join or come back take up their share of picks gradually
//! (see [`crate::SlowStart`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::SlowStart;
use crate::route::endpoint::Endpoint;
use crate::route::gate::{GateState, Share};

/// How often the share of a member in slow start is raised: twenty steps per window,
/// at most every 10 ms.
const STEPS: u32 = 20;

/// The members in slow start, and its configuration.
pub(super) struct SlowStarts<S> {
    config: SlowStart,
    /// Each connection in slow start and when its slow start began.
    starting: Vec<(Arc<Endpoint<S>>, Instant)>,
    next_step: Option<Instant>,
}

impl<S> SlowStarts<S> {
    pub(super) fn new(config: SlowStart) -> Self {
        Self { config, starting: Vec::new(), next_step: None }
    }

    /// The gate a new connection opens with: probation when `returning` from a broken
    /// connection (and probation is on), a slow start's first share when `joining`
    /// (and slow start is on), else fully open.
    pub(super) fn initial_gate(&self, returning: bool, joining: bool) -> GateState {
        if returning && self.config.probation {
            GateState::PROBE_WAITING
        } else if joining && !self.config.window.is_zero() {
            GateState::slow_start(self.first_share())
        } else {
            GateState::OPEN
        }
    }

    /// The gate a probation member opens to once its probe succeeded.
    pub(super) fn after_probe(&self) -> GateState {
        if self.config.window.is_zero() {
            GateState::OPEN
        } else {
            GateState::slow_start(self.first_share())
        }
    }

    /// The configured starting share, at least the least share above none.
    fn first_share(&self) -> Share {
        Share::of(self.config.min_share).max(Share::LEAST)
    }

    /// Starts the slow start of `endpoint` from its first share, now (opens it fully
    /// with no window).
    pub(super) fn start(&mut self, endpoint: Arc<Endpoint<S>>, now: Instant) {
        if self.config.window.is_zero() {
            endpoint.set_share(Share::FULL);
            return;
        }
        endpoint.set_share(self.first_share());
        self.starting.retain(|(e, _)| e.id != endpoint.id);
        self.starting.push((endpoint, now));
        self.next_step.get_or_insert(now + self.step());
    }

    /// Whether connection `id` is in slow start.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.starting.iter().any(|(e, _)| e.id == id)
    }

    fn step(&self) -> Duration {
        (self.config.window / STEPS).max(Duration::from_millis(10))
    }

    /// When the shares must next be raised.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.next_step
    }

    /// Raises the share of every member in slow start to where its slow start stands;
    /// those whose window has passed open fully and leave. Connections no longer in rotation
    /// (`in_rotation` false) leave too.
    pub(super) fn advance(&mut self, now: Instant, in_rotation: impl Fn(u64) -> bool) {
        if self.next_step.is_none_or(|t| t > now) {
            return;
        }
        let (window, min) = (self.config.window, self.config.min_share);
        self.starting.retain(|(endpoint, started)| {
            if !in_rotation(endpoint.id) {
                return false;
            }
            let elapsed = now.duration_since(*started);
            if elapsed >= window {
                endpoint.set_share(Share::FULL);
                return false;
            }
            let share = min + (1.0 - min) * elapsed.as_secs_f64() / window.as_secs_f64();
            endpoint.set_share(Share::of(share));
            true
        });
        self.next_step = (!self.starting.is_empty()).then(|| now + self.step());
    }
}
