//! What steady's etcd users (`steady-slicer`'s store and election, `steady-discovery`'s
//! registry) share, so that both behave the same:
//!
//! * [`connect_with`]: a client of a cluster run with TLS, client certificates or
//!   users ([`EtcdAccess`], [`EtcdTls`]), whose first call has been made, so settings
//!   that cannot work fail at start with a [`ConnectError`] naming the cause (a wrong
//!   CA, a refused client certificate, a wrong password, a user without access to the
//!   prefix, a server that is not there) instead of in every later call;
//! * every client connects through a channel of steady's that sends each call to a member
//!   whose connection is up (see `members.rs`): etcd-client's own balance keeps picking a
//!   dead member of a cluster, failing most calls while one member of three is away;
//! * [`bounded`]: an etcd call that gives up after a timeout, with a [`CallError`] that
//!   names the call;
//! * [`HeldLease`]: a lease renewed every third of its TTL by a task of its own (a failed
//!   renewal is retried within half a second), revoked when dropped unless left to lapse
//!   (for fault injection). Its [`LeaseMode`] says when it counts as lost: for a lock
//!   ([`LeaseMode::Strict`], the election) no later than etcd's own expiry, even while
//!   etcd cannot be asked; for an identity ([`LeaseMode::Tolerant`], the registry) only
//!   when etcd answers that the lease is gone, so an outage of etcd that etcd survives
//!   with its leases costs no identity.
//!
//! # Dependencies
//!
//! `etcd-client` (with its rustls TLS), the tonic it speaks, tokio and tracing; nothing
//! of steady's.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

use std::fmt;
use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, Error as EtcdError, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod access;
mod members;

pub use access::{connect_with, ConnectError, EtcdAccess, EtcdTls};

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

/// A client of the cluster at `endpoints` (plaintext, no user; see [`connect_with`] for
/// the rest), every call of which is meant to be
/// [`bounded`] by `timeout`: connections give up after `timeout`, and HTTP/2 keep-alives
/// every second (answered within `timeout`, also while idle) notice a dead connection.
///
/// # Errors
///
/// [`CallError`] when no endpoint answers within `timeout`.
pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<Client, CallError> {
    bounded(timeout, "connect", connect_client(endpoints, connect_options(timeout))).await
}

/// A client of `endpoints` speaking through [`members::Members`] (each call to a member
/// whose connection is up), not etcd-client's own balance.
async fn connect_client(
    endpoints: &[String],
    options: etcd_client::ConnectOptions,
) -> Result<Client, EtcdError> {
    Client::connect_with_balanced_channel(endpoints, Some(options), members::MembersBuilder).await
}

/// The options every connection of steady's is made with: connections give up after
/// `timeout`; HTTP/2 keep-alives every second notice a dead connection.
fn connect_options(timeout: Duration) -> etcd_client::ConnectOptions {
    etcd_client::ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_keep_alive(Duration::from_secs(1), timeout)
        .with_keep_alive_while_idle(true)
}

/// How long a watch waits before its `failures`-th attempt in a row to re-establish
/// itself (`failures` >= 1; 0 waits nothing): 50 ms, doubling, at most 2 s. The store's,
/// the registry's and the job specs' etcd watches all back off so.
pub fn watch_backoff(failures: u32) -> Duration {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);
    match failures {
        0 => Duration::ZERO,
        n => (FIRST * 2u32.pow((n - 1).min(16))).min(MAX),
    }
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

/// What a [`HeldLease`]'s keeper concludes when etcd does not answer its renewals: the
/// one choice between a lease that guards a lock and one that carries an identity.
///
/// In both modes the keeper renews every third of the TTL, retries a failed renewal
/// soon (after 50 ms, doubling up to 500 ms, never more than a third of the TTL) rather
/// than a whole period later, and reports the lease lost at once when etcd answers that
/// it does not know it (it lapsed or was revoked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// For a lock or a leader's term (fencing): the lease counts as lost at the keeper's
    /// own deadline, the sending of the last answered renewal plus the TTL etcd granted,
    /// which is never later than etcd's own expiry. The holder never believes it holds
    /// a lease that etcd has let go, at the price of giving the lease up during any
    /// outage of etcd longer than what is left of the TTL, even one that etcd survives
    /// with the lease (a restarted etcd restores its leases with a fresh TTL). After the
    /// deadline the keeper stops; the lease is not renewed again.
    Strict,
    /// For an identity (a task's index in the registry): the lease counts as lost only
    /// when etcd answers that it does not know it. While etcd does not answer, past the
    /// deadline too, the keeper keeps retrying and the lease still counts as held, so the
    /// holder keeps using what it holds; [`HeldLease::is_confirmed`] tells whether etcd
    /// has vouched for it lately. Through an etcd restart the lease lives on: etcd
    /// restores it with a fresh TTL and the next renewal is answered.
    ///
    /// The cost: while the holder is cut off from an etcd that stays up (a network
    /// partition) longer than the TTL, etcd lets the lease go and deletes its keys, and
    /// another task may take what they held before this holder hears of it (at its
    /// first answered renewal). Right for an identity, where two tasks briefly sharing
    /// an index only overlap subsets; wrong for a lock.
    Tolerant,
}

/// The first wait before retrying a failed renewal; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// The longest wait between two renewal attempts after a failure (or a third of the
/// TTL, when that is shorter).
const MAX_RETRY: Duration = Duration::from_millis(500);

/// An etcd lease renewed every third of its TTL by a task of its own, which reports
/// when it is lost as its [`LeaseMode`] says.
///
/// Dropping it revokes the lease (in the background, when a tokio runtime is running),
/// which deletes every key attached to it at once; after [`HeldLease::stop_renewing`]
/// it is left to lapse instead, as a crashed process's would.
pub struct HeldLease {
    client: Client,
    id: i64,
    mode: LeaseMode,
    timeout: Duration,
    keeper: JoinHandle<()>,
    /// Tells the keeper to stop renewing (it still reports the lapse).
    stop: watch::Sender<bool>,
    /// `true` while the lease counts as held (see [`LeaseMode`]).
    held: watch::Receiver<bool>,
    /// The keeper's deadline: when the last answered renewal was sent, plus the TTL.
    renewed_until: watch::Receiver<Instant>,
    /// Who holds it, for the logs.
    holder: &'static str,
}

impl fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLease")
            .field("id", &self.id)
            .field("holder", &self.holder)
            .field("mode", &self.mode)
            .field("alive", &self.is_alive())
            .field("confirmed", &self.is_confirmed())
            .finish_non_exhaustive()
    }
}

impl HeldLease {
    /// Grants a lease of `ttl` and starts keeping it alive in `mode`; `holder` names it
    /// in logs (`"registry"`, `"leadership"`).
    ///
    /// # Errors
    ///
    /// [`CallError`] when etcd does not grant it within `timeout`.
    pub async fn grant(
        client: &Client,
        ttl: Duration,
        timeout: Duration,
        holder: &'static str,
        mode: LeaseMode,
    ) -> Result<Self, CallError> {
        let mut leases = client.lease_client();
        let granted_at = Instant::now();
        let response = bounded(timeout, "lease grant", leases.grant(ttl.as_secs() as i64, None)).await?;
        let (id, ttl) = (response.id(), Duration::from_secs(response.ttl().max(1) as u64));
        let (held_tx, held) = watch::channel(true);
        let (renewed_tx, renewed_until) = watch::channel(granted_at + ttl);
        let (stop, stopped) = watch::channel(false);
        let keeper = Keeper {
            client: client.clone(),
            id,
            ttl,
            mode,
            timeout,
            held: held_tx,
            renewed_until: renewed_tx,
            holder,
        };
        let keeper = tokio::spawn(keeper.run(stopped));
        Ok(Self { client: client.clone(), id, mode, timeout, keeper, stop, held, renewed_until, holder })
    }

    /// The lease's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The mode it is kept in.
    pub fn mode(&self) -> LeaseMode {
        self.mode
    }

    /// Follows whether the lease counts as held (`false` once it is lost, see
    /// [`LeaseMode`]; it never turns `true` again).
    pub fn held(&self) -> watch::Receiver<bool> {
        self.held.clone()
    }

    /// Whether the lease counts as held (see [`LeaseMode`]).
    pub fn is_alive(&self) -> bool {
        *self.held.borrow()
    }

    /// Until when etcd is known to keep the lease: the sending of the last renewal etcd
    /// answered (or of the grant) plus the TTL it granted, never later than etcd's own
    /// expiry (unless something revokes the lease). A [`LeaseMode::Strict`] lease is
    /// lost at this instant unless a renewal moves it; a [`LeaseMode::Tolerant`] one
    /// may outlive it while etcd does not answer.
    pub fn renewed_until(&self) -> Instant {
        *self.renewed_until.borrow()
    }

    /// Whether the lease is held and etcd vouches for it now: [`HeldLease::is_alive`]
    /// and [`HeldLease::renewed_until`] still ahead. `false` while a
    /// [`LeaseMode::Tolerant`] lease outlives its deadline during an outage of etcd.
    pub fn is_confirmed(&self) -> bool {
        self.is_alive() && Instant::now() < self.renewed_until()
    }

    /// Stops renewing: the lease lapses a TTL after its last renewal, and dropping it
    /// no longer revokes it. In either mode the keeper then reports it lost at its
    /// deadline, [`HeldLease::renewed_until`].
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

/// The task that renews one lease; see [`LeaseMode`] for what it concludes when etcd
/// does not answer.
struct Keeper {
    client: Client,
    id: i64,
    ttl: Duration,
    mode: LeaseMode,
    timeout: Duration,
    held: watch::Sender<bool>,
    /// The deadline: pushed back by each answered renewal to the time the renewal was
    /// *sent* plus the TTL etcd grants. Measured from the sending, it is never later
    /// than etcd's own expiry.
    renewed_until: watch::Sender<Instant>,
    holder: &'static str,
}

impl Keeper {
    /// Renews the lease until it is lost (reported through `held`) or, once `stop`
    /// says so, until its deadline passes.
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let period = self.ttl / 3;
        let max_retry = MAX_RETRY.min(period);
        let mut renewals: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
        let mut renewing = true;
        let mut next_attempt = period;
        // Failed attempts in a row: the retry backoff, and one warning per outage.
        let mut failures = 0_u32;
        let mut unconfirmed_reported = false;
        loop {
            let deadline = *self.renewed_until.borrow();
            // A strict lease (or one left to lapse) is lost at the deadline; a tolerant
            // one only on etcd's word.
            let lapses_at_deadline = self.mode == LeaseMode::Strict || !renewing;
            tokio::select! {
                // The lapse first: when it is due, nothing else may report the lease alive.
                biased;
                _ = tokio::time::sleep_until(deadline), if lapses_at_deadline => {
                    self.lost("lease lapsed: no renewal answered within its TTL");
                    return;
                }
                _ = stop.changed(), if renewing => {
                    renewing = false;
                    renewals = None;
                    continue;
                }
                _ = tokio::time::sleep(next_attempt), if renewing => {}
            }
            let sent = Instant::now();
            // A strict lease must not count as held past its deadline while an attempt
            // is pending: the attempt gives up at the deadline, and the lapse follows.
            let mut give_up = sent + self.timeout.min(period);
            if self.mode == LeaseMode::Strict {
                give_up = give_up.min(deadline);
            }
            let attempt = renew(&mut self.client, self.id, &mut renewals);
            let error = match tokio::time::timeout_at(give_up, attempt).await {
                Ok(Renewal::Renewed(granted)) => {
                    self.renewed_until.send_replace(sent + Duration::from_secs(granted));
                    if failures > 0 {
                        tracing::info!(
                            lease = self.id,
                            holder = self.holder,
                            failures,
                            "lease renewed again"
                        );
                    }
                    (failures, unconfirmed_reported, next_attempt) = (0, false, period);
                    continue;
                }
                Ok(Renewal::Gone) => {
                    self.lost("etcd no longer knows the lease (lapsed or revoked)");
                    return;
                }
                Ok(Renewal::Failed(error)) => error,
                Err(_) => "no answer in time".to_owned(),
            };
            renewals = None;
            failures += 1;
            next_attempt = FIRST_RETRY.saturating_mul(2_u32.saturating_pow(failures - 1)).min(max_retry);
            if failures == 1 {
                tracing::warn!(lease = self.id, %error, holder = self.holder, "lease renewal failed; retrying");
            } else {
                tracing::debug!(lease = self.id, %error, holder = self.holder, failures, "lease renewal failed; retrying");
            }
            let past_deadline = Instant::now() >= *self.renewed_until.borrow();
            if self.mode == LeaseMode::Tolerant && past_deadline && !unconfirmed_reported {
                unconfirmed_reported = true;
                tracing::warn!(
                    lease = self.id,
                    holder = self.holder,
                    "lease past its deadline without an answer from etcd; still held until etcd says it is gone"
                );
            }
        }
    }

    fn lost(&self, why: &'static str) {
        self.held.send_replace(false);
        tracing::warn!(lease = self.id, holder = self.holder, mode = ?self.mode, why, "lease lost");
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

#[cfg(test)]
mod backoff_tests {
    use super::*;

    #[test]
    fn a_watch_backs_off_from_50_ms_doubling_to_2_s() {
        let waits: Vec<u128> = (0..8).map(|n| watch_backoff(n).as_millis()).collect();
        assert_eq!(waits, [0, 50, 100, 200, 400, 800, 1600, 2000]);
        assert_eq!(watch_backoff(u32::MAX), Duration::from_secs(2));
    }
}
