//! What steady's etcd users (`steady-slicer`'s store and election, `steady-discovery`'s
//! registry) share, so that both behave the same:
//!
//! * [`bounded`]: an etcd call that gives up after a timeout, with a [`CallError`] that
//!   names the call;
//! * [`HeldLease`]: a lease renewed every third of its TTL by a task of its own, whose
//!   lapse is reported no later than etcd's own, revoked when dropped unless left to
//!   lapse (for fault injection).
//!
//! # Dependencies
//!
//! `etcd-client`, tokio and tracing; nothing of steady's.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

use std::fmt;
use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, Error as EtcdError, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// An etcd call that failed or got no answer in time.
#[derive(Debug)]
pub enum CallError {
    /// etcd (or the connection to it) answered with an error.
    Failed {
        /// The call (`"get"`, `"lease grant"`, ...).
        what: &'static str,
        /// What etcd-client said.
        error: EtcdError,
    },
    /// No answer within the timeout.
    TimedOut {
        /// The call.
        what: &'static str,
        /// The timeout.
        after: Duration,
    },
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { what, error } => write!(f, "etcd {what}: {error}"),
            Self::TimedOut { what, after } => write!(f, "etcd {what}: no answer in {after:?}"),
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Failed { error, .. } => Some(error),
            Self::TimedOut { .. } => None,
        }
    }
}

/// A client of the cluster at `endpoints`, every call of which is meant to be
/// [`bounded`] by `timeout`: connections give up after `timeout`, and HTTP/2 keep-alives
/// every second (answered within `timeout`, also while idle) notice a dead connection.
///
/// # Errors
///
/// [`CallError`] when no endpoint answers within `timeout`.
pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<Client, CallError> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_keep_alive(Duration::from_secs(1), timeout)
        .with_keep_alive_while_idle(true);
    bounded(timeout, "connect", Client::connect(endpoints, Some(options))).await
}

/// `request`, given up after `timeout`.
///
/// # Errors
///
/// [`CallError::Failed`] with etcd's error, [`CallError::TimedOut`] without an answer.
pub async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    request: impl Future<Output = Result<T, EtcdError>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result.map_err(|error| CallError::Failed { what, error }),
        Err(_) => Err(CallError::TimedOut { what, after: timeout }),
    }
}

/// An etcd lease renewed every third of its TTL by a task of its own.
///
/// Dropping it revokes the lease (in the background, when a tokio runtime is running),
/// which deletes every key attached to it at once; after [`HeldLease::stop_renewing`]
/// it is left to lapse instead, as a crashed process's would.
pub struct HeldLease {
    client: Client,
    id: i64,
    timeout: Duration,
    keeper: JoinHandle<()>,
    /// Tells the keeper to stop renewing (it still reports the lapse).
    stop: watch::Sender<bool>,
    /// `true` while the lease is alive, as far as the keeper knows.
    held: watch::Receiver<bool>,
    /// Who holds it, for the logs.
    holder: &'static str,
}

impl fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLease")
            .field("id", &self.id)
            .field("holder", &self.holder)
            .field("alive", &self.is_alive())
            .finish_non_exhaustive()
    }
}

impl HeldLease {
    /// Grants a lease of `ttl` and starts keeping it alive; `holder` names it in logs
    /// (`"registry"`, `"leadership"`).
    ///
    /// # Errors
    ///
    /// [`CallError`] when etcd does not grant it within `timeout`.
    pub async fn grant(
        client: &Client,
        ttl: Duration,
        timeout: Duration,
        holder: &'static str,
    ) -> Result<Self, CallError> {
        let mut leases = client.lease_client();
        let granted_at = Instant::now();
        let response = bounded(timeout, "lease grant", leases.grant(ttl.as_secs() as i64, None)).await?;
        let (id, ttl) = (response.id(), Duration::from_secs(response.ttl().max(1) as u64));
        let (held_tx, held) = watch::channel(true);
        let (stop, stopped) = watch::channel(false);
        let keeper = tokio::spawn(keep_alive(
            client.clone(),
            id,
            ttl,
            granted_at + ttl,
            timeout,
            held_tx,
            stopped,
            holder,
        ));
        Ok(Self { client: client.clone(), id, timeout, keeper, stop, held, holder })
    }

    /// The lease's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Follows whether the lease is alive (`false` once it lapsed or etcd forgot it).
    pub fn held(&self) -> watch::Receiver<bool> {
        self.held.clone()
    }

    /// Whether the lease is alive as far as its keeper knows.
    pub fn is_alive(&self) -> bool {
        *self.held.borrow()
    }

    /// Stops renewing: the lease lapses a TTL after its last renewal, and dropping it
    /// no longer revokes it.
    pub fn stop_renewing(&self) {
        self.stop.send_replace(true);
    }

    /// Revokes the lease now and waits for etcd's answer (a lease etcd no longer knows
    /// counts as revoked).
    ///
    /// # Errors
    ///
    /// [`CallError`] when etcd does not answer within the timeout.
    pub async fn revoke(&self) -> Result<(), CallError> {
        self.keeper.abort();
        // Drop revokes too, but without waiting: here the caller waits to know.
        self.stop.send_replace(true);
        let mut leases = self.client.lease_client();
        match bounded(self.timeout, "lease revoke", leases.revoke(self.id)).await {
            Ok(_) => Ok(()),
            // Already gone (lapsed): what revoking wanted.
            Err(CallError::Failed { error, .. }) if error.to_string().contains("lease not found") => Ok(()),
            Err(error) => Err(error),
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.keeper.abort();
        if *self.stop.borrow() {
            return; // Revoked already, or left to lapse.
        }
        // Revoking deletes the keys at once, so nobody waits for a TTL. Without a runtime
        // (or if etcd is unreachable) the lease lapses by itself.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (mut leases, id, timeout, holder) =
                (self.client.lease_client(), self.id, self.timeout, self.holder);
            runtime.spawn(async move {
                if let Err(error) = bounded(timeout, "lease revoke", leases.revoke(id)).await {
                    tracing::warn!(lease = id, %error, holder, "cannot revoke the lease; it will lapse");
                }
            });
        }
    }
}

/// Renews lease `id` every third of `ttl` until told to stop, and reports (through
/// `held`) when it lapses: at `expires`, pushed back by each renewal to the time the
/// renewal was *sent* plus the TTL etcd grants. Measured from the sending, our deadline
/// is never later than etcd's, so the holder never believes it holds a lease etcd has
/// let go.
#[allow(clippy::too_many_arguments)]
async fn keep_alive(
    mut client: Client,
    id: i64,
    ttl: Duration,
    mut expires: Instant,
    timeout: Duration,
    held: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
    holder: &'static str,
) {
    let period = ttl / 3;
    let mut renewals: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut renewing = true;
    loop {
        tokio::select! {
            // The lapse first: when it is due, nothing else may report the lease alive.
            biased;
            _ = tokio::time::sleep_until(expires) => {
                held.send_replace(false);
                tracing::warn!(lease = id, holder, "lease lapsed");
                return;
            }
            _ = stop.changed(), if renewing => {
                renewing = false;
                renewals = None;
                continue;
            }
            _ = tokio::time::sleep(period), if renewing => {}
        }
        let sent = Instant::now();
        match tokio::time::timeout(timeout.min(period), renew(&mut client, id, &mut renewals)).await {
            Ok(Renewal::Renewed(granted)) => expires = sent + Duration::from_secs(granted),
            Ok(Renewal::Gone) => {
                held.send_replace(false);
                tracing::warn!(lease = id, holder, "etcd no longer knows the lease (lapsed or revoked)");
                return;
            }
            Ok(Renewal::Failed(error)) => {
                tracing::warn!(lease = id, %error, holder, "lease renewal failed; retrying");
                renewals = None;
            }
            Err(_) => {
                tracing::warn!(lease = id, holder, "lease renewal timed out; retrying");
                renewals = None;
            }
        }
    }
}

/// What one renewal found.
enum Renewal {
    /// The lease lives on for this many seconds.
    Renewed(u64),
    /// etcd does not know the lease any more.
    Gone,
    /// No answer (a broken stream, an unreachable etcd): try again while time is left.
    Failed(String),
}

/// One renewal, on the keep-alive stream (opened first if needed).
async fn renew(
    client: &mut Client,
    id: i64,
    renewals: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Renewal {
    let granted = |ttl: i64| if ttl > 0 { Renewal::Renewed(ttl as u64) } else { Renewal::Gone };
    if let Some((keeper, responses)) = renewals.as_mut() {
        if let Err(error) = keeper.keep_alive().await {
            return Renewal::Failed(error.to_string());
        }
        return match responses.message().await {
            Ok(Some(response)) => granted(response.ttl()),
            Ok(None) => Renewal::Failed("keep-alive stream ended".to_owned()),
            Err(error) => Renewal::Failed(error.to_string()),
        };
    }
    // Opening the stream renews once; etcd-client reports a lease etcd does not know
    // (a first answer with TTL 0) as this error, and only then.
    match client.lease_keep_alive(id).await {
        Ok(opened) => *renewals = Some(opened),
        Err(EtcdError::LeaseKeepAliveError(message)) if message == "lease not found" => return Renewal::Gone,
        Err(error) => return Renewal::Failed(error.to_string()),
    }
    // The opening renewal's TTL is not handed out: ask for it.
    match client.lease_client().time_to_live(id, None).await {
        Ok(response) => granted(response.ttl()),
        Err(error) => Renewal::Failed(error.to_string()),
    }
}
