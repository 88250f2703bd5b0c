//! The connections the pages serve: a table of at most a fixed number of slots, each
//! holding what its connection is doing and since when. A sweeper closes connections
//! past their timeouts; the accept loop closes the idlest one when a newcomer needs a
//! slot and all are taken, so idle or slow peers cannot lock a fresh scraper out.
//!
//! A connection is in one of three phases, each with a deadline:
//!
//! * head: from the accept, or from the first byte after a response, until its request
//!   head is complete; the whole head within the head timeout, however it trickles in
//!   (progress does not extend it).
//! * busy: from the head's arrival until the response is all written to the socket,
//!   within the head timeout too (a peer that does not read its response is closed).
//! * idle: keep-alive, from the response written until the next request's first byte,
//!   within the idle timeout.
//!
//! hyper's own `header_read_timeout` is not used: hyper 1.x starts its timer when it
//! starts reading a head, which on keep-alive is as soon as the previous response is
//! done, so it would bound the idle time by the head timeout; it has nothing for a
//! response a peer does not read. The phases here are told apart by the socket (bytes
//! read and written, and its flush), the service (a request arrived) and the response
//! body (hyper took it), with no assumption on hyper's timers.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long a connection may spend in each phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// A request head, from the accept or its first byte; and a response, from the head.
    pub(crate) head: Duration,
    /// Keep-alive between a response and the next request's first byte.
    pub(crate) idle: Duration,
}

/// What a connection is doing; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    /// `taken`: hyper has the whole response body (in its buffer or the socket's).
    Busy {
        taken: bool,
    },
    Idle,
}

#[derive(Debug)]
struct Activity {
    phase: Phase,
    /// When the phase began.
    since: Instant,
    /// The last byte read or written, or the accept.
    progress: Instant,
}

/// One connection's activity, shared by its socket ([`TrackedIo`]), its responses
/// ([`TrackedBody`]) and the table.
#[derive(Debug, Clone)]
pub(crate) struct Tracker(Arc<Mutex<Activity>>);

impl Tracker {
    fn new(now: Instant) -> Self {
        Self(Arc::new(Mutex::new(Activity { phase: Phase::Head, since: now, progress: now })))
    }

    fn lock(&self) -> MutexGuard<'_, Activity> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) {
        let now = Instant::now();
        let mut a = self.lock();
        a.progress = now;
        if a.phase == Phase::Idle {
            a.phase = Phase::Head;
            a.since = now;
        }
    }

    fn wrote(&self) {
        self.lock().progress = Instant::now();
    }

    /// A request head has arrived: its response is being made.
    pub(crate) fn request(&self) {
        let now = Instant::now();
        let mut a = self.lock();
        a.phase = Phase::Busy { taken: false };
        a.since = now;
        a.progress = now;
    }

    fn body_taken(&self) {
        let mut a = self.lock();
        if let Phase::Busy { .. } = a.phase {
            a.phase = Phase::Busy { taken: true };
        }
    }

    /// The socket was flushed. hyper flushes the socket once its write buffer is empty
    /// (it writes a message, then flushes), so after it took the body this is the
    /// response all written: the connection idles.
    fn flushed(&self) {
        let mut a = self.lock();
        if a.phase == (Phase::Busy { taken: true }) {
            a.phase = Phase::Idle;
            a.since = Instant::now();
        }
    }
}

/// A slot's connection is closed by dropping the slot: its sender goes, and the
/// connection's task, waiting on the receiver, drops the connection.
#[derive(Debug)]
struct Slot {
    id: u64,
    tracker: Tracker,
    _close: oneshot::Sender<Infallible>,
}

/// A connection admitted to the table.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// Its slot, for [`Slots::leave`].
    pub(crate) id: u64,
    /// Its activity, to give its socket and responses.
    pub(crate) tracker: Tracker,
    /// Resolves (with an error: nothing is ever sent) when the connection must close:
    /// it timed out, its slot went to a newer connection, or the table is gone.
    pub(crate) close: oneshot::Receiver<Infallible>,
}

/// The table; see the module documentation.
#[derive(Debug)]
pub(crate) struct Slots {
    max: usize,
    timeouts: Timeouts,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    slots: Vec<Slot>,
}

impl Slots {
    /// A table of `max` slots (at least one).
    pub(crate) fn new(max: usize, timeouts: Timeouts) -> Self {
        Self { max: max.max(1), timeouts, table: Mutex::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection accepted now. When all are taken, the idlest connection
    /// is closed to make room.
    ///
    /// The idlest is the one not busy (no response under way) that made no progress
    /// for longest; only when all are busy, the busy one that made no progress for
    /// longest. This order is safe for the peers that matter:
    ///
    /// * A connection that is not busy has no response in flight: closing it loses no
    ///   answer. On keep-alive, the client connects again (as after an idle timeout); a
    ///   head in progress has not been answered, and a real client sends its head in one
    ///   write, so the one whose last byte is oldest is a slow peer, not a scraper.
    /// * A fresh connection's progress is its accept, so a scraper that just connected
    ///   is the last non-busy one to go: as many connections as there are slots must
    ///   arrive after it, before it sends its request (microseconds), for it to be
    ///   closed.
    /// * A busy connection is closed only when every slot is busy, and then the one
    ///   whose response has waited longest for the peer to read it: a scraper's response
    ///   is written at once, so that one is a peer that does not read.
    ///
    /// The evicted connection's slot is reused at once; its socket closes when its task
    /// next runs, so the sockets open exceed the slots by at most the connections closed
    /// in that moment.
    pub(crate) fn admit(&self) -> Admitted {
        let now = Instant::now();
        let (close_tx, close) = oneshot::channel();
        let tracker = Tracker::new(now);
        let mut table = self.lock();
        if table.slots.len() >= self.max {
            let idlest = table
                .slots
                .iter()
                .enumerate()
                .min_by_key(|(_, slot)| {
                    let a = slot.tracker.lock();
                    (matches!(a.phase, Phase::Busy { .. }), a.progress)
                })
                .map(|(i, _)| i);
            if let Some(i) = idlest {
                let slot = table.slots.swap_remove(i);
                let a = slot.tracker.lock();
                tracing::debug!(
                    phase = ?a.phase,
                    quiet = ?now.saturating_duration_since(a.progress),
                    "status: every slot taken; closing the idlest connection"
                );
            }
        }
        let id = table.next;
        table.next += 1;
        table.slots.push(Slot { id, tracker: tracker.clone(), _close: close_tx });
        Admitted { id, tracker, close }
    }

    /// Frees connection `id`'s slot (it ended), if it still has one.
    pub(crate) fn leave(&self, id: u64) {
        self.lock().slots.retain(|slot| slot.id != id);
    }

    /// Closes every connection past its phase's deadline.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let timeouts = self.timeouts;
        self.lock().slots.retain(|slot| {
            let a = slot.tracker.lock();
            let limit = if a.phase == Phase::Idle { timeouts.idle } else { timeouts.head };
            let keep = now.saturating_duration_since(a.since) < limit;
            if !keep {
                tracing::debug!(phase = ?a.phase, ?limit, "status: closing a connection past its timeout");
            }
            keep
        });
    }

    /// How often to [`sweep`](Self::sweep): an eighth of the shorter timeout, between
    /// 10 and 250 ms (so a connection is closed at most that late).
    pub(crate) fn sweep_every(&self) -> Duration {
        (self.timeouts.head.min(self.timeouts.idle) / 8)
            .clamp(Duration::from_millis(10), Duration::from_millis(250))
    }
}

/// A socket that reports its progress to its [`Tracker`].
#[derive(Debug)]
pub(crate) struct TrackedIo<T> {
    inner: T,
    tracker: Tracker,
}

impl<T> TrackedIo<T> {
    pub(crate) fn new(inner: T, tracker: Tracker) -> Self {
        Self { inner, tracker }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TrackedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.tracker.read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TrackedIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.tracker.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.tracker.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(polled, Poll::Ready(Ok(()))) {
            self.tracker.flushed();
        }
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that tells its [`Tracker`] when hyper has taken it (dropped it: hyper
/// drops a body once it has buffered its last frame).
#[derive(Debug)]
pub(crate) struct TrackedBody {
    inner: Full<Bytes>,
    tracker: Tracker,
}

impl TrackedBody {
    pub(crate) fn new(inner: Full<Bytes>, tracker: Tracker) -> Self {
        Self { inner, tracker }
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        self.tracker.body_taken();
    }
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(max: usize) -> Slots {
        Slots::new(max, Timeouts { head: Duration::from_secs(5), idle: Duration::from_secs(30) })
    }

    fn closed(admitted: &mut Admitted) -> bool {
        admitted.close.try_recv() == Err(oneshot::error::TryRecvError::Closed)
    }

    async fn later() {
        tokio::time::advance(Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_closes_the_idlest_connection_and_a_busy_one_last() {
        let slots = slots(3);
        let mut a = slots.admit();
        later().await;
        let mut b = slots.admit();
        later().await;
        let mut c = slots.admit();
        later().await;
        // a is busy (a request came), b read a byte since c's accept: c is the idlest.
        a.tracker.request();
        b.tracker.read();
        later().await;
        let mut d = slots.admit();
        assert!(closed(&mut c));
        assert!(!closed(&mut a) && !closed(&mut b));
        // Then b (older than d), though a made no progress for longer: a is busy.
        later().await;
        let mut e = slots.admit();
        assert!(closed(&mut b));
        assert!(!closed(&mut a) && !closed(&mut d));
        // All busy: the one quiet for longest goes.
        d.tracker.request();
        e.tracker.request();
        let mut f = slots.admit();
        assert!(closed(&mut a));
        assert!(!closed(&mut d) && !closed(&mut e) && !closed(&mut f));
        // A connection that ended leaves its slot: no one is closed for the next.
        slots.leave(f.id);
        let _g = slots.admit();
        assert!(!closed(&mut d) && !closed(&mut e));
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_deadline() {
        let slots = slots(4);
        let mut head = slots.admit();
        let mut idle = slots.admit();
        idle.tracker.request();
        idle.tracker.body_taken();
        idle.tracker.flushed();
        tokio::time::advance(Duration::from_millis(4900)).await;
        // Progress does not extend a head.
        head.tracker.read();
        slots.sweep();
        assert!(head.close.try_recv() == Err(oneshot::error::TryRecvError::Empty));
        tokio::time::advance(Duration::from_millis(200)).await;
        slots.sweep();
        assert!(head.close.try_recv() == Err(oneshot::error::TryRecvError::Closed));
        // Idle past the head timeout is fine; a byte starts a head with its own deadline.
        assert!(idle.close.try_recv() == Err(oneshot::error::TryRecvError::Empty));
        idle.tracker.read();
        tokio::time::advance(Duration::from_millis(4900)).await;
        slots.sweep();
        assert!(idle.close.try_recv() == Err(oneshot::error::TryRecvError::Empty));
        tokio::time::advance(Duration::from_millis(200)).await;
        slots.sweep();
        assert!(idle.close.try_recv() == Err(oneshot::error::TryRecvError::Closed));
        // A response not written (the peer does not read) is bounded by the head timeout.
        let mut stuck = slots.admit();
        stuck.tracker.request();
        stuck.tracker.body_taken();
        tokio::time::advance(Duration::from_millis(5100)).await;
        slots.sweep();
        assert!(stuck.close.try_recv() == Err(oneshot::error::TryRecvError::Closed));
    }
}
