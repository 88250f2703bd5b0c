//! The `AssignmentDistributor` gRPC service of a [`Distributor`]: steady-proto's Watch
//! server over messages encoded once per generation (at [`Distributor::publish`]), so a
//! generation costs one encoding however many watchers it reaches.

use steady_proto::assignment::WatchRequest;
use steady_proto::{EncodedWatch, EncodedWatchServer, EncodedWatchStream};
use tonic::Status;

use super::Distributor;

/// The tonic service of a [`Distributor`] (made by [`Distributor::service`]): add it to a
/// server like any generated one.
pub type DistributorServer = EncodedWatchServer<Distributor>;

impl EncodedWatch for Distributor {
    fn watch(&self, request: WatchRequest) -> Result<EncodedWatchStream, Status> {
        Distributor::watch(self, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use steady_proto::assignment::AssignmentUpdate;
    use steady_slice::Assignment;

    #[test]
    fn the_bytes_sent_are_the_update_message_a_client_decodes() {
        let distributor = Distributor::new();
        let assignment = Assignment::single(7, vec![0, 2]).unwrap();
        assert!(distributor.publish("users", assignment.clone()));
        let published = distributor.lock().by_name["users"].borrow().clone().unwrap();
        let decoded = AssignmentUpdate::decode(published.encoded.clone()).unwrap();
        assert_eq!(Assignment::try_from(decoded).unwrap(), assignment);
    }
}
