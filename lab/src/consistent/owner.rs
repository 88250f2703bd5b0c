//! The backends' echo handler, written as an application of an exclusive job must be
//! (`docs/exclusive.md`, the guide): take a key handle when the request arrives, do the
//! work, check the handle before answering. On the way it checks ownership against every
//! other backend of the fleet (all in this process), to catch two tasks believing they
//! hold one key at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use steady_proto::{DEFAULT_KEY_HEADER, MOVED_HEADER};
use steady_slice::SliceKey;
use steady_slicelet::Slicelet;
use steady_testing::echo::echo_server::Echo;
use steady_testing::echo::{EchoReply, EchoRequest};
use tonic::{Request, Response, Status};

/// The first byte of a reply's payload when the backend held the key while it answered.
pub(super) const OWNED: u8 = 1;
/// The first byte of a reply's payload when it did not (eventual mode only: an exclusive
/// backend refuses instead).
pub(super) const NOT_OWNED: u8 = 0;

/// What one backend's handler saw. Shared by clones.
#[derive(Debug, Default)]
pub(super) struct OwnerCounts {
    /// Answered OK while holding the key.
    pub(super) served: AtomicU64,
    /// Answered OK without holding the key (the layer let it through: an eventual
    /// Slicelet behind the client's generation).
    pub(super) unowned: AtomicU64,
    /// Refused in the handler: the key handle was gone by the time the handler ran or
    /// before it answered (the belief narrowed after the layer's check).
    pub(super) late_refusals: AtomicU64,
    /// Answered while another backend also held the key: its handle was valid before and
    /// after another backend's Slicelet said it held the key, so both believed at once.
    pub(super) overlaps: AtomicU64,
}

/// Backend `task`'s echo service: answers with the payload, its first byte saying
/// whether the backend held the key ([`OWNED`]), and its task index.
#[derive(Debug, Clone)]
pub(super) struct OwnerEcho {
    pub(super) task: u32,
    pub(super) slicelet: Slicelet,
    /// Every backend's Slicelet, this one's included (skipped by task index).
    pub(super) fleet: Arc<[Slicelet]>,
    /// In an exclusive job a key not held is refused; in an eventual one it is served.
    pub(super) exclusive: bool,
    pub(super) counts: Arc<OwnerCounts>,
}

impl OwnerEcho {
    /// Whether another backend's Slicelet holds `key` now.
    fn held_elsewhere(&self, key: SliceKey) -> bool {
        self.fleet.iter().any(|s| s.task() != self.task && s.holds(key) == Some(true))
    }

    /// The refusal an exclusive backend answers with, as its layer would: the misroute
    /// status naming the newest generation it knows, so the channel routes it again.
    fn refusal(&self) -> Status {
        self.counts.late_refusals.fetch_add(1, Ordering::Relaxed);
        let generation = self.slicelet.generation().unwrap_or(0);
        let mut status = Status::failed_precondition(format!(
            "lab: task {} no longer holds this key (generation {generation})",
            self.task
        ));
        status.metadata_mut().insert(MOVED_HEADER, generation.into());
        status
    }
}

#[tonic::async_trait]
impl Echo for OwnerEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let key = request.metadata().get(DEFAULT_KEY_HEADER).map(|v| SliceKey::of(v.as_bytes()));
        let mut payload = request.into_inner().payload;
        let owned = match key {
            None => false,
            Some(key) => match self.slicelet.key_handle(key) {
                None if self.exclusive => return Err(self.refusal()),
                None => false,
                Some(handle) => {
                    // Valid before the look at the others and after it: if another held
                    // the key in between, two tasks believed they held it at once.
                    let elsewhere = self.held_elsewhere(key);
                    if !handle.is_valid() {
                        if self.exclusive {
                            return Err(self.refusal());
                        }
                        false
                    } else {
                        if elsewhere {
                            self.counts.overlaps.fetch_add(1, Ordering::Relaxed);
                        }
                        true
                    }
                }
            },
        };
        if owned {
            self.counts.served.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counts.unowned.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(first) = payload.first_mut() {
            *first = if owned { OWNED } else { NOT_OWNED };
        }
        Ok(Response::new(EchoReply { payload, task: self.task }))
    }
}
