//! [`Members`]: the channel every steady etcd client speaks through, which sends each call
//! to a member of the cluster whose connection is up.
//!
//! # Why not etcd-client's own
//!
//! etcd-client balances over the members with tonic's balance channel: each member is a
//! lazily reconnecting connection, and the power-of-two-choices pick takes the one with
//! fewer calls in flight. A dead member has none (a call to it fails at once, `connection
//! refused`), so it keeps being picked: with one member of three down, steady's store
//! failed most of its calls until the member came back, the election's renewals with them.
//!
//! # What this one does
//!
//! Calls go round-robin over the members that are not *down*. A member never connected
//! yet is connected to by the first call that picks it, before that call's request is
//! handed over: when the connection cannot be made, the member is marked down and the
//! call goes on to the next member, so that a member already dead when the client starts
//! costs no call at all. A call that fails in the
//! transport (the service errs: no connection could be made, or it broke; an answer of
//! etcd's, an error status included, is not such a failure) marks its member *down*, and
//! a probe task of its own connects to it again (after 100 ms, doubling up to 2 s between
//! tries) until a connection is made; the member is up again with that connection. While
//! every member is down, each call tries to connect to them in turn before it is handed
//! over, and goes out on the first that answers (so a member back before its probe noticed
//! serves at once); when none answers it goes out on the next one and fails fast, so that
//! a single-member etcd behaves as before: calls fail while it is away, and go through
//! once it is back.
//!
//! The cost of a member's death is one failed call per client (the one that found it
//! dead), which the caller retries as it retries any unanswered call, instead of a share
//! of every call for as long as the member stays away.
//!
//! # Bounds
//!
//! One probe task per down member at most; it ends once the member is up or the client
//! is dropped. The members are the endpoints the client was given; nothing a member sends
//! adds any.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use etcd_client::{BalancedChannelBuilder, Channel as EtcdChannel};
use tonic::body::Body;
use tonic::codegen::http::{Request, Response, Uri};
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceExt};

/// The first wait before a down member is probed; it doubles up to [`MAX_PROBE_WAIT`].
const FIRST_PROBE_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two probes of a down member.
const MAX_PROBE_WAIT: Duration = Duration::from_secs(2);

/// Builds a [`Members`] channel for `etcd_client::Client::connect_with_balanced_channel`:
/// the client hands the members' endpoints (with its TLS and timeouts set) over the
/// returned sender before its first call.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MembersBuilder;

impl BalancedChannelBuilder for MembersBuilder {
    type Error = tonic::transport::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(EtcdChannel, tokio::sync::mpsc::Sender<Change<Uri, Endpoint>>), Self::Error> {
        let (tx, rx) = tokio::sync::mpsc::channel(buffer_size.max(1));
        let members =
            Members { shared: Arc::new(Shared { changes: Mutex::new(Some(rx)), ..Shared::default() }) };
        Ok((EtcdChannel::Custom(BoxCloneSyncService::new(members)), tx))
    }
}

/// The channel; see the module documentation.
#[derive(Clone)]
pub(crate) struct Members {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Endpoints added or removed by the client, applied before each call's pick.
    changes: Mutex<Option<tokio::sync::mpsc::Receiver<Change<Uri, Endpoint>>>>,
    members: Mutex<Vec<Member>>,
    /// The round-robin position.
    next: AtomicUsize,
}

struct Member {
    uri: Uri,
    endpoint: Endpoint,
    /// Its connection: lazy at first, then the one its last probe made.
    channel: Channel,
    /// Bumped whenever `channel` is replaced, so that a failure of an older connection
    /// does not mark a fresh one down.
    epoch: u64,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Never connected yet: the first call to pick it connects first, and passes it
    /// over when that fails, before the request is handed to anyone.
    Unverified,
    Up,
    /// A call failed in the transport; its probe runs.
    Down,
}

/// What a call picked: a member, its connection, whether that connection was ever made.
struct Pick {
    uri: Uri,
    endpoint: Endpoint,
    channel: Channel,
    epoch: u64,
    /// Its connection is known to work: it was made, and no call on it failed since.
    trusted: bool,
}

impl Shared {
    /// Applies the endpoints the client added or removed since the last call.
    fn apply_changes(&self) {
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(rx) = changes.as_mut() else { return };
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match rx.try_recv() {
                Ok(Change::Insert(uri, endpoint)) => {
                    members.retain(|m| m.uri != uri);
                    let channel = endpoint.connect_lazy();
                    members.push(Member { uri, endpoint, channel, epoch: 0, state: State::Unverified });
                }
                Ok(Change::Remove(uri)) => members.retain(|m| m.uri != uri),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    *changes = None;
                    return;
                }
            }
        }
    }

    /// The next member not down, round-robin (any member when all are down); `None`
    /// when there is no member at all.
    fn pick(&self) -> Option<Pick> {
        self.apply_changes();
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        if members.is_empty() {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let all_down = members.iter().all(|m| m.state == State::Down);
        (0..members.len())
            .map(|i| &members[(start + i) % members.len()])
            .find(|m| m.state != State::Down || all_down)
            .map(|m| Pick {
                uri: m.uri.clone(),
                endpoint: m.endpoint.clone(),
                channel: m.channel.clone(),
                epoch: m.epoch,
                trusted: m.state == State::Up,
            })
    }

    /// The member at `uri` is up on `channel`, a connection just made.
    fn connected(&self, uri: &Uri, channel: Channel) {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(member) = members.iter_mut().find(|m| &m.uri == uri) {
            member.channel = channel;
            member.epoch += 1;
            member.state = State::Up;
        }
    }

    /// Marks the member at `uri` down after its connection of `epoch` failed, and starts
    /// its probe (unless it is down already: its probe runs).
    fn failed(self: &Arc<Self>, uri: &Uri, epoch: u64) {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        let Some(member) = members.iter_mut().find(|m| &m.uri == uri) else { return };
        if member.epoch != epoch || member.state == State::Down {
            return;
        }
        member.state = State::Down;
        tracing::debug!(member = %uri, "etcd: a call to this member failed in the transport; probing it");
        let (endpoint, uri, shared) = (member.endpoint.clone(), uri.clone(), Arc::downgrade(self));
        tokio::spawn(probe(shared, uri, endpoint));
    }

    /// The connection a call goes out on: the next member's, connected first when it
    /// never was, or when every member is down (a member that cannot be connected to is
    /// marked down and the next one tried, the request still in hand; one that can is up
    /// again at once, without waiting for its probe); with its URI and epoch.
    async fn connection(self: &Arc<Self>) -> Result<(Uri, Channel, u64), BoxError> {
        let tries = self.members.lock().unwrap_or_else(|p| p.into_inner()).len().max(1) + 1;
        for _ in 0..tries {
            let Some(pick) = self.pick() else { break };
            if pick.trusted {
                return Ok((pick.uri, pick.channel, pick.epoch));
            }
            match pick.endpoint.connect().await {
                Ok(channel) => {
                    self.connected(&pick.uri, channel.clone());
                    return Ok((pick.uri, channel, pick.epoch + 1));
                }
                Err(error) => {
                    tracing::debug!(member = %pick.uri, %error, "etcd: cannot connect to this member");
                    self.failed(&pick.uri, pick.epoch);
                }
            }
        }
        // Every member is down (or there is none): the call fails fast on the next one.
        let pick = self.pick().ok_or("etcd: no member to call")?;
        Ok((pick.uri, pick.channel, pick.epoch))
    }
}

/// Connects to a down member until a connection is made, then puts it up with it; ends
/// early when the client is gone or the member was removed.
async fn probe(shared: Weak<Shared>, uri: Uri, endpoint: Endpoint) {
    let mut wait = FIRST_PROBE_WAIT;
    loop {
        tokio::time::sleep(wait).await;
        if shared.strong_count() == 0 {
            return;
        }
        match endpoint.connect().await {
            Ok(channel) => {
                let Some(shared) = shared.upgrade() else { return };
                shared.connected(&uri, channel);
                tracing::debug!(member = %uri, "etcd: member reachable again");
                return;
            }
            Err(error) => {
                tracing::trace!(member = %uri, %error, "etcd: member still unreachable");
                wait = (wait * 2).min(MAX_PROBE_WAIT);
            }
        }
    }
}

impl Service<Request<Body>> for Members {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each call waits for its own member's connection in its future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move {
            let (uri, channel, epoch) = shared.connection().await?;
            let result = channel.oneshot(request).await;
            if result.is_err() {
                shared.failed(&uri, epoch);
            }
            result.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(port: u16) -> (Uri, Endpoint) {
        let uri: Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        (uri.clone(), Endpoint::from(uri))
    }

    #[tokio::test]
    async fn picks_go_round_robin_over_members_up_and_over_all_when_none_is() {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        *shared.changes.lock().unwrap() = Some(rx);
        for port in [1, 2, 3] {
            let (uri, endpoint) = endpoint(port);
            tx.send(Change::Insert(uri, endpoint)).await.unwrap();
        }
        let picks = |n: usize| -> Vec<u16> {
            (0..n).map(|_| shared.pick().unwrap().uri.port_u16().unwrap()).collect::<Vec<_>>()
        };
        let mut first = picks(3);
        first.sort_unstable();
        assert_eq!(first, [1, 2, 3]);

        // Member 2 fails: it is passed over until its probe puts it up again.
        let (two, _) = endpoint(2);
        shared.failed(&two, 0);
        assert!(picks(6).iter().all(|&p| p != 2));
        // A failure of an older connection (another epoch) changes nothing.
        let (one, _) = endpoint(1);
        shared.failed(&one, 7);
        assert!(picks(6).contains(&1));

        // All down: every member is tried again in turn.
        shared.failed(&one, 0);
        let (three, _) = endpoint(3);
        shared.failed(&three, 0);
        let mut all = picks(3);
        all.sort_unstable();
        assert_eq!(all, [1, 2, 3]);

        // A removed member is never picked.
        tx.send(Change::Remove(two)).await.unwrap();
        assert!(picks(6).iter().all(|&p| p != 2));
    }
}
