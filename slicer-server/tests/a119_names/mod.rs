//! An A119 client of the binary, for the tests: the endpoint names of a job's first
//! assignment.

use std::time::Duration;

use futures_util::StreamExt;

/// The endpoint names of `job`'s first assignment over A119 from the binary at `address`.
pub async fn a119_endpoints(address: &str, job: &str) -> Result<Vec<String>, tonic::Status> {
    use steady_proto::autosharding::reassembly::Reassembly;
    use steady_proto::autosharding::v1::autosharding_service_client::AutoshardingServiceClient;
    use steady_proto::autosharding::v1::{InitialClientConfig, WatchShardingAssignmentRequest};
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap();
    let mut client = AutoshardingServiceClient::connect(endpoint).await.unwrap();
    let first = WatchShardingAssignmentRequest {
        initial_client_config: Some(InitialClientConfig {
            target: job.to_owned(),
            client_uuid: "a119-names-test".to_owned(),
            latest_generation: 0,
        }),
        ..Default::default()
    };
    // The request side stays open (a pending stream) while the responses are read.
    let requests = futures_util::stream::iter([first]).chain(futures_util::stream::pending());
    let mut responses = client.watch_sharding_assignment(requests).await?.into_inner();
    let mut reassembly = Reassembly::default();
    loop {
        let response = tokio::time::timeout(Duration::from_secs(60), responses.message())
            .await
            .expect("a response within 60 s")?
            .expect("the stream goes on");
        if let Some(chunk) = response.chunk {
            reassembly.chunk(chunk);
        } else if let Some(metadata) = response.metadata {
            return Ok(reassembly.finish(metadata).assignment.expect("a valid assignment").endpoints);
        }
    }
}
