//! A tiny echo backend for the demo, the benchmarks and tests: it answers every
//! `Echo` call with the payload and its own task index. Also the latency percentile
//! the demo and the throughput benchmark report.

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::echo::echo_server::{Echo, EchoServer};
use crate::echo::{EchoReply, EchoRequest};

/// Backend task `0`'s echo service.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoTask(pub u32);

#[tonic::async_trait]
impl Echo for EchoTask {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        Ok(Response::new(EchoReply { payload: request.into_inner().payload, task: self.0 }))
    }
}

/// Serves [`EchoTask`] `task` on 127.0.0.1, on a port the OS chooses. The server stops
/// when the returned sender is used or dropped.
///
/// # Errors
///
/// When the socket cannot be bound.
pub async fn serve_echo(task: u32) -> std::io::Result<(SocketAddr, oneshot::Sender<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        Server::builder().add_service(EchoServer::new(EchoTask(task))).serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = stopped.await;
            },
        ),
    );
    Ok((addr, stop))
}

/// The sample at quantile `p` (0.0 to 1.0, nearest rank) of `sorted` samples, such as
/// request latencies in µs; 0 when there are none.
pub fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentile_takes_the_nearest_rank() {
        let samples: Vec<u32> = (1..=101).collect();
        assert_eq!(percentile(&samples, 0.5), 51);
        assert_eq!(percentile(&samples, 0.99), 100);
        assert_eq!(percentile(&samples, 1.0), 101);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
