//! One unary call through tonic over loopback: steady's channel against a plain tonic
//! `Channel` to one of the same servers, in the same run.
//!
//! Group `channel_call`: 4 echo servers on 127.0.0.1 (a runtime of their own), one call
//! at a time from a current-thread client runtime:
//! * `plain` — a tonic `Channel` to server 0 (the baseline: the transport's own cost);
//! * `steady` — `SteadyChannel` over all 4 (k = 4): pick, in-flight accounting, the
//!   error mapping of its response future.
//! * `plain_keyed` / `steady_keyed` — the same with a slice key in the metadata of every call
//!   (100 keys); steady routes it by an assignment of 4 slices, one per server, and adds what
//!   a keyed call carries: the generation it was routed by (`x-steady-generation`) and a
//!   handle to route it again if its backend refuses it because the key moved.
//!
//! What it is for: the client's own cost per call (`steady` - `plain`), e.g. to check
//! that naming the channel's response future instead of boxing one per call costs
//! nothing. Ratios: `cargo run --release -p steady-benches --bin bench-ratios --
//! channel_call plain`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use steady_balance::BalanceConfig;
use steady_benches::echo_calls;
use steady_slice::{Slice, SliceKey};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::EchoRequest;
use steady_tonic::SteadyChannel;
use tonic::transport::{Channel, Endpoint};

const SERVERS: u32 = 4;

fn channel_call(c: &mut Criterion) {
    // The servers run on a runtime of their own, so the client's runtime measures the
    // client.
    let servers = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let running: Vec<_> = servers.block_on(async {
        let mut out = Vec::new();
        for task in 0..SERVERS {
            out.push(steady_testing::echo::serve_echo(task).await);
        }
        out
    });
    let endpoints: Vec<Endpoint> =
        running.iter().map(|(addr, _)| Endpoint::from_shared(format!("http://{addr}")).unwrap()).collect();
    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut group = c.benchmark_group("channel_call");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_with_input(BenchmarkId::new("plain", SERVERS), &(), |b, _| {
        let mut client: EchoClient<Channel> =
            client_rt.block_on(async { EchoClient::new(endpoints[0].connect().await.unwrap()) });
        b.iter_custom(|iters| client_rt.block_on(echo_calls(&mut client, iters, |_| ())));
    });
    group.bench_with_input(BenchmarkId::new("steady", SERVERS), &(), |b, _| {
        let mut client = client_rt.block_on(async {
            let channel = SteadyChannel::builder(BalanceConfig::new(0, SERVERS as usize))
                .from_endpoints(endpoints.clone())
                .unwrap();
            assert!(channel.balance().wait_for_members(SERVERS as usize, Duration::from_secs(10)).await);
            EchoClient::new(channel)
        });
        b.iter_custom(|iters| client_rt.block_on(echo_calls(&mut client, iters, |_| ())));
    });
    group.bench_with_input(BenchmarkId::new("plain_keyed", SERVERS), &(), |b, _| {
        let mut client: EchoClient<Channel> =
            client_rt.block_on(async { EchoClient::new(endpoints[0].connect().await.unwrap()) });
        b.iter_custom(|iters| client_rt.block_on(keyed_calls(&mut client, iters)));
    });
    group.bench_with_input(BenchmarkId::new("steady_keyed", SERVERS), &(), |b, _| {
        let (mut client, _assignment) = client_rt.block_on(async {
            let channel = SteadyChannel::builder(BalanceConfig::new(0, SERVERS as usize))
                .from_endpoints(endpoints.clone())
                .unwrap();
            assert!(channel.balance().wait_for_members(SERVERS as usize, Duration::from_secs(10)).await);
            let slices =
                (0..u64::from(SERVERS)).map(|i| Slice::new(SliceKey(i << 62), vec![i as u32])).collect();
            let assignment = steady_balance::Assignment::new(1, slices).unwrap();
            let held = steady_benches::hold_assignment(channel.balance(), assignment).await;
            (EchoClient::new(channel), held)
        });
        b.iter_custom(|iters| client_rt.block_on(keyed_calls(&mut client, iters)));
    });
    group.finish();
    drop(running);
}

/// `iters` echo calls, each with one of 100 slice keys in its metadata.
async fn keyed_calls<T>(client: &mut EchoClient<T>, iters: u64) -> Duration
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let keys: Vec<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> =
        (0..100).map(|i| format!("user:{i}").parse().unwrap()).collect();
    let start = std::time::Instant::now();
    for i in 0..iters {
        let mut request = tonic::Request::new(EchoRequest { payload: b"ping".to_vec() });
        request.metadata_mut().insert("x-slice-key", keys[(i % 100) as usize].clone());
        std::hint::black_box(client.echo(request).await.expect("the echo servers answer"));
    }
    start.elapsed()
}

criterion_group!(benches, channel_call);
criterion_main!(benches);
