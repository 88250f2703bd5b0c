//! The backend author's program: a backend task serving its RPCs with a Slicelet in
//! front, which knows the slices this task holds, counts requests for keys it does not
//! hold (misroutes) and reports the task's keyed load to the Assigner.
//!
//! ```sh
//! cargo run -p steady-examples --example backend -- 0 127.0.0.1:50051 [http://127.0.0.1:50070]
//! ```
//!
//! Arguments: this task's index in the backend job, where to listen, and optionally the
//! control plane (the `operator` example, or `steady-slicer`), which serves both the
//! assignments to follow and the collector to report load to. Stops on Ctrl-C.
//!
//! A backend only needs `steady-slicelet` (and tonic): no etcd client, no command-line
//! parser, no assigner and no client balancer. (The echo service's generated code comes
//! from the workspace's test support, `steady_testing::echo`, standing in for the
//! application's own.)

use std::error::Error;
use std::time::Duration;

use steady_core::Backoff;
use steady_slicelet::Slicelet;
use steady_testing::echo::echo_server::{Echo, EchoServer};
use steady_testing::echo::{EchoReply, EchoRequest};
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

/// The backend job's name, as the operator's control plane knows it.
const JOB: &str = "users";

/// The application's service: here it echoes, naming the task that answered.
struct EchoTask(u32);

#[tonic::async_trait]
impl Echo for EchoTask {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        Ok(Response::new(EchoReply { payload: request.into_inner().payload, task: self.0 }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let task: u32 = args.next().unwrap_or_else(|| "0".to_owned()).parse()?;
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:50051".to_owned()).parse()?;
    let control = args.next();

    let slicelet = Slicelet::new(task);
    // Kept alive while the server runs: dropping it stops the reports.
    let _reporter = match control {
        Some(control) => {
            let control = Endpoint::from_shared(control)?;
            slicelet.follow(steady_proto::watch_assignments(control.clone(), JOB, Backoff::default())?);
            Some(slicelet.report_to(control, JOB, Duration::from_secs(1)))
        }
        None => None,
    };

    println!("backend task {task} on {listen}");
    Server::builder()
        .layer(slicelet.layer())
        .add_service(EchoServer::new(EchoTask(task)))
        .serve_with_shutdown(listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!(
        "backend task {task}: {} keyed requests, {} misrouted, generation {:?}",
        slicelet.keyed_requests(),
        slicelet.misrouted(),
        slicelet.generation()
    );
    Ok(())
}
