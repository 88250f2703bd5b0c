//! [`TaskEndpoint`]: how the channel addresses a backend task.

use tonic::transport::Endpoint;

/// A backend task's tonic `Endpoint`, compared by URI (so a task that moves to another
/// address is noticed and reconnected).
#[derive(Clone, Debug)]
pub struct TaskEndpoint(pub Endpoint);

impl PartialEq for TaskEndpoint {
    fn eq(&self, other: &Self) -> bool {
        self.0.uri() == other.0.uri()
    }
}
