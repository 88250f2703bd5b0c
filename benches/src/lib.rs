//! Baselines for steady's criterion benchmarks, and the tool that turns criterion's
//! results into the ratios we quote.
//!
//! Every figure steady publishes is a ratio against a baseline measured in the same
//! run: the machine is shared and noisy, absolute nanoseconds are not comparable
//! across runs, ratios mostly are.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod report;

/// Ringsteady (unscaled) the naive way: build the whole ring of `N` van der Corput
/// positions, sort it, find the frontend's position and take `k` clockwise.
///
/// `O(N log N)` per frontend. This is the baseline that the lazy `O(k log N)` ring walk
/// in `steady_subset` is measured against; it returns the same subsets (tested).
pub fn naive_ring_subset(frontend: usize, backends: usize, size: usize) -> Vec<usize> {
    let mut ring: Vec<(u64, usize)> = (0..backends).map(|n| ((n as u64).reverse_bits(), n)).collect();
    ring.sort_unstable();
    let pos = (frontend as u64).reverse_bits();
    let start = ring.partition_point(|&(p, _)| p < pos);
    (0..size.min(backends)).map(|i| ring[(start + i) % backends].1).collect()
}

/// `iters` unary `Echo` calls one after another through `client`, timed; `after(i)` runs
/// after call `i` and is timed with it (a bench that scrapes every so many calls charges
/// the scrapes to the calls).
pub async fn echo_calls<T>(
    client: &mut steady_testing::echo::echo_client::EchoClient<T>,
    iters: u64,
    mut after: impl FnMut(u64),
) -> std::time::Duration
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let start = std::time::Instant::now();
    for i in 0..iters {
        let request = steady_testing::echo::EchoRequest { payload: b"ping".to_vec() };
        std::hint::black_box(client.echo(request).await.expect("the echo servers answer"));
        after(i);
    }
    start.elapsed()
}

/// Makes `balance` follow `assignment` and waits until its routing table uses it. Keep
/// the returned sender: dropping it ends the source (the balancer keeps the assignment),
/// and a bench may send later generations on it.
pub async fn hold_assignment<S, K, C>(
    balance: &steady_balance::Balance<S, K, C>,
    assignment: steady_slice::Assignment,
) -> tokio::sync::mpsc::UnboundedSender<Result<steady_slice::Assignment, steady_slice::AssignmentError>> {
    let generation = assignment.generation();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    balance.follow_assignments(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    tx.send(Ok(assignment)).expect("the balancer follows the source");
    while balance.stats().assignment_generation != Some(generation) {
        let version = balance.stats().version;
        balance.wait_for_version(version + 1).await;
    }
    tx
}

/// The keyed benches' assignment: `slices` evenly spaced slices over `tasks` tasks,
/// `replicas` each, spread so that every task holds about as many; `generation` shifts
/// which tasks hold which slice.
pub fn spread_assignment(
    generation: u64,
    slices: usize,
    tasks: usize,
    replicas: usize,
) -> steady_slice::Assignment {
    use steady_slice::{Assignment, Slice, SliceKey};
    let step = u64::MAX / slices as u64;
    let slices = (0..slices)
        .map(|i| {
            Slice::new(
                SliceKey(i as u64 * step),
                (0..replicas)
                    .map(|r| ((i * 7 + r * 101 + generation as usize) % tasks) as u32)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    Assignment::new(generation, slices).expect("a spread assignment is valid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_subset::{Ringsteady, Subsetting};

    #[test]
    fn naive_ring_agrees_with_the_lazy_ring_walk() {
        for n in [1usize, 7, 20, 100, 1000] {
            for m in [0usize, 1, 5, 99, 12345] {
                assert_eq!(naive_ring_subset(m, n, 20), Ringsteady::unscaled().subset(m, n, 20).unwrap());
            }
        }
    }
}
