//! An A119 client of the binary, for the tests: one stream, its first assignment, acks.

// Each test binary that includes it uses a part.
#![allow(dead_code)]

use std::time::Duration;

use steady_proto::autosharding::reassembly::{Reassembly, Received};
use steady_proto::autosharding::v1::autosharding_service_client::AutoshardingServiceClient;
use steady_proto::autosharding::v1::{
    AssignmentAck, InitialClientConfig, WatchShardingAssignmentRequest, WatchShardingAssignmentResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// One A119 stream to the binary, open while the value lives.
pub struct A119Client {
    requests: mpsc::Sender<WatchShardingAssignmentRequest>,
    responses: tonic::Streaming<WatchShardingAssignmentResponse>,
    reassembly: Reassembly,
}

impl A119Client {
    /// Opens a stream on `job` to the binary at `address`, as client `uuid`.
    pub async fn open(address: &str, job: &str, uuid: &str) -> Result<Self, tonic::Status> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap();
        let mut client = AutoshardingServiceClient::connect(endpoint).await.unwrap();
        let (requests, rx) = mpsc::channel(8);
        let first = WatchShardingAssignmentRequest {
            initial_client_config: Some(InitialClientConfig {
                target: job.to_owned(),
                client_uuid: uuid.to_owned(),
                latest_generation: 0,
            }),
            ..Default::default()
        };
        requests.send(first).await.unwrap();
        let responses = client.watch_sharding_assignment(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Self { requests, responses, reassembly: Reassembly::default() })
    }

    /// The next assignment the stream carries (configurations skipped).
    pub async fn assignment(&mut self) -> Result<Received, tonic::Status> {
        loop {
            let response = tokio::time::timeout(Duration::from_secs(60), self.responses.message())
                .await
                .expect("a response within 60 s")?
                .expect("the stream goes on");
            if let Some(chunk) = response.chunk {
                self.reassembly.chunk(chunk);
            } else if let Some(metadata) = response.metadata {
                return Ok(self.reassembly.finish(metadata).assignment.expect("a valid assignment"));
            }
        }
    }

    /// Acknowledges `generation`: accepted, or refused with `message`.
    pub async fn ack(&self, generation: i64, accepted: bool, message: &str) {
        let ack = AssignmentAck { generation, accepted, error_message: message.to_owned() };
        let request = WatchShardingAssignmentRequest { assignment_ack: Some(ack), ..Default::default() };
        self.requests.send(request).await.unwrap();
    }
}

/// The endpoint names of `job`'s first assignment over A119 from the binary at `address`.
pub async fn a119_endpoints(address: &str, job: &str) -> Result<Vec<String>, tonic::Status> {
    let mut client = A119Client::open(address, job, "a119-test").await?;
    Ok(client.assignment().await?.endpoints)
}
