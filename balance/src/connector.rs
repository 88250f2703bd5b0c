//! The two bounds every balancer entry point shares, named once.

use std::fmt;

use tower::Service;

use crate::error::BoxError;

/// A backend task's address, as the job view gives it (a socket address, a URI, a
/// tonic `Endpoint`, ...): cloneable, comparable (to notice a task that moved),
/// printable (for logs) and shareable. Implemented for every such type.
pub trait Address: Clone + PartialEq + fmt::Debug + Send + Sync + 'static {}

impl<T: Clone + PartialEq + fmt::Debug + Send + Sync + 'static> Address for T {}

/// Makes a connection (a service `S`) to an address: a tower `Service<T>` whose
/// errors box and whose futures can run on any runtime thread. Implemented for every
/// such service, `tower::service_fn(|address| async { ... })` included.
pub trait Connector<T, S>:
    Service<T, Response = S, Error: Into<BoxError>, Future: Send + 'static> + Send + 'static
{
}

impl<T, S, C> Connector<T, S> for C
where
    C: Service<T, Response = S> + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
}
