//! The client author's program: a frontend task that calls a backend job through a
//! `SteadyChannel`, keeping connections to its own subset of the job, and routing keyed
//! calls to the backends the job's assignment names.
//!
//! ```sh
//! TASK_INDEX=0 cargo run -p steady-examples --example frontend -- \
//!     127.0.0.1:50051,127.0.0.1:50052 [http://127.0.0.1:50070]
//! ```
//!
//! The first argument is the backend job (a static list: task `i` at the `i`-th address;
//! `steady_discovery::dns` and `steady_discovery::registry` give the same views from DNS or
//! etcd). The second, optional, is a Distributor to follow assignments from (the
//! `operator` example, or `steady-slicer`). The frontend's own index comes from
//! `TASK_INDEX` or a StatefulSet hostname (`web-3`); with neither, it takes a random one
//! and random subsetting.
//!
//! The echo service's generated code comes from the workspace's test support
//! (`steady_testing::echo`), standing in for the application's own.

use std::error::Error;

use steady_balance::BalanceConfig;
use steady_core::Backoff;
use steady_discovery::identity::{self, IdentitySource};
use steady_discovery::Discovery;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::EchoRequest;
use steady_tonic::{watch_assignments, SteadyChannel, DEFAULT_KEY_HEADER};
use tonic::transport::Endpoint;

/// The backend job's name, as the operator's control plane knows it.
const JOB: &str = "users";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let backends = args.next().unwrap_or_else(|| "127.0.0.1:50051,127.0.0.1:50052".to_owned());
    let distributor = args.next();

    // Who am I in the frontend job, and which backends are there?
    let me = identity::resolve(&[IdentitySource::Env("TASK_INDEX".into()), IdentitySource::HostnameOrdinal])?;
    let job = Discovery::fixed(backends.split(','));

    // Connections to 10 of the job's tasks (all of them if it has fewer).
    let config = BalanceConfig::new(me.index(), 10).with_algorithm(me.algorithm());
    let channel = SteadyChannel::builder(config).from_addresses(job.views())?;
    if let Some(distributor) = distributor {
        channel.follow_assignments(watch_assignments(
            Endpoint::from_shared(distributor)?,
            JOB,
            Backoff::default(),
        )?);
    }

    // Any generated tonic client takes the channel. A call with an `x-slice-key` goes to
    // its key's backends once an assignment is in force; one without, to the less loaded
    // of two subset members.
    let mut client = EchoClient::new(channel.clone());
    for user in ["ada", "grace", "edsger", "barbara"] {
        let mut request = tonic::Request::new(EchoRequest { payload: user.as_bytes().to_vec() });
        request.metadata_mut().insert(DEFAULT_KEY_HEADER, user.parse()?);
        match client.echo(request).await {
            Ok(reply) => println!("{user}: served by backend task {}", reply.into_inner().task),
            Err(status) => println!("{user}: {:?}: {}", status.code(), status.message()),
        }
    }
    let stats = channel.stats();
    println!("frontend {} ({:?}): subset {:?}", me.index(), me.origin(), stats.subset);
    Ok(())
}
