//! The Slicelet's load meter, through its server layer as a backend runs it: keyed
//! requests counted per slice, decayed into rates, and the heaviest keys found. Decay is
//! checked on tokio's paused clock.

use std::convert::Infallible;
use std::time::Duration;

use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::{MeterConfig, Slicelet};
use tower::{service_fn, Layer, Service, ServiceExt};

/// Four equal slices: task 0 holds slices 0 and 2, task 1 slices 1 and 3.
fn four_slices(generation: u64) -> Assignment {
    Assignment::new(
        generation,
        (0..4u64).map(|i| Slice::new(SliceKey(i << 62), vec![(i % 2) as u32])).collect(),
    )
    .unwrap()
}

/// The slice of `four_slices` that holds `key`.
fn slice_of(key: &str) -> usize {
    (SliceKey::of(key).get() >> 62) as usize
}

/// A server stack as a backend runs it: the slicelet's layer over a service that answers.
fn server(slicelet: &Slicelet) -> impl Service<http::Request<String>, Error = Infallible> + Clone {
    slicelet
        .layer()
        .layer(service_fn(|_: http::Request<String>| async { Ok::<_, Infallible>(http::Response::new(())) }))
}

async fn send(stack: &mut (impl Service<http::Request<String>, Error = Infallible> + Clone), key: &str) {
    let request = http::Request::builder().header("x-slice-key", key).body(String::new()).unwrap();
    stack.ready().await.unwrap().call(request).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_slicelet_counts_per_slice_and_its_decayed_rates_converge_to_the_offered_rate() {
    let config = MeterConfig { half_life: Duration::from_secs(10), sample_one_in: 1 };
    let slicelet = Slicelet::with_meter(0, config).unwrap();
    assert!(slicelet.load_report("users").is_none(), "no assignment, no report");
    slicelet.set_assignment(four_slices(1));
    let mut stack = server(&slicelet);
    // 400 keys, each asked once per second: the offered rate of a slice is the number of
    // its keys per second.
    let keys: Vec<String> = (0..400).map(|i| format!("user-{i}")).collect();
    let mut offered = [0f64; 4];
    for k in &keys {
        offered[slice_of(k)] += 1.0;
    }
    let mut last = None;
    for _second in 0..30 {
        for k in &keys {
            send(&mut stack, k).await;
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        last = slicelet.load_report("users");
    }
    let report = last.take().expect("an assignment is held");
    assert_eq!((report.job(), report.task(), report.generation()), ("users", 0, 1));
    // Task 0 holds slices 0 and 2; their rates are what was offered to them.
    assert_eq!(report.slices().iter().map(|s| s.0).collect::<Vec<_>>(), [SliceKey(0), SliceKey(2 << 62)]);
    for (&(start, rate), want) in report.slices().iter().zip([offered[0], offered[2]]) {
        assert!((rate - want).abs() < 1e-6 * want, "slice {start:?}: {rate}/s, offered {want}/s");
    }
    // The other half were misroutes: counted as such, and not reported.
    assert_eq!(slicelet.misrouted() as f64, 30.0 * (offered[1] + offered[3]));

    // The offered rate triples: the estimate follows, within 2% after four half-lives.
    for _second in 0..40 {
        for k in &keys {
            for _ in 0..3 {
                send(&mut stack, k).await;
            }
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        last = slicelet.load_report("users");
    }
    let report = last.unwrap();
    let rate = report.slices()[0].1;
    assert!((rate / (3.0 * offered[0]) - 1.0).abs() < 0.07, "{rate}/s after 40 s at {}/s", 3.0 * offered[0]);
    let rate_after_8_half_lives = {
        for _second in 0..40 {
            for k in &keys {
                for _ in 0..3 {
                    send(&mut stack, k).await;
                }
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        slicelet.load_report("users").unwrap().slices()[0].1
    };
    assert!((rate_after_8_half_lives / (3.0 * offered[0]) - 1.0).abs() < 0.005, "{rate_after_8_half_lives}");
}

#[tokio::test(start_paused = true)]
async fn the_heavy_hitters_find_a_key_with_a_fifth_of_the_traffic() {
    // Default sampling (one request in 8 feeds the sketch).
    let slicelet = Slicelet::new(0);
    slicelet.set_assignment(Assignment::single(1, vec![0]).unwrap());
    let mut stack = server(&slicelet);
    // 1,000 requests a second for 30 s: one key in five is "hot", the rest spread over
    // 5,000 keys (each well under 1/64 of the traffic).
    let mut rng = steady_subset::prng::SplitMix64::new(3);
    for _second in 0..30 {
        for i in 0..1000 {
            let key = if i % 5 == 0 { "hot".to_owned() } else { format!("cold-{}", rng.next() % 5000) };
            send(&mut stack, &key).await;
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        slicelet.load_report("job");
    }
    let report = slicelet.load_report("job").unwrap();
    let (key, rate) = report.hot_keys()[0];
    assert_eq!(key, SliceKey::of("hot"), "the heaviest key reported: {:?}", &report.hot_keys()[..3]);
    assert!((rate / 200.0 - 1.0).abs() < 0.15, "the hot key's rate: {rate}/s, offered 200/s");
    assert!(report.hot_keys().len() <= steady_slicelet::report::MAX_REPORTED_KEYS);
    assert!(report.hot_keys()[1].1 < rate / 4.0, "the next key is far colder: {:?}", report.hot_keys()[1]);
    assert!((report.total() / 1000.0 - 1.0).abs() < 1e-6, "the one slice carries it all: {}", report.total());
}

/// A client of gRPC's autosharding protocol sends the 8-byte slice key, base64 on the wire,
/// in `x-slice-key-bin`: the Slicelet counts it where the text key would have counted.
#[tokio::test(start_paused = true)]
async fn a_binary_slice_key_counts_as_the_text_key_it_stands_for() {
    let config = MeterConfig { half_life: Duration::from_secs(10), sample_one_in: 1 };
    let slicelet = Slicelet::with_meter(0, config).unwrap();
    slicelet.set_assignment(four_slices(1));
    let mut stack = server(&slicelet);
    // Keys of slices 0 and 1 (task 0 holds 0, so the slice-1 key is a misroute).
    let keys: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
    let key0 = keys.iter().find(|k| slice_of(k) == 0).unwrap();
    let key1 = keys.iter().find(|k| slice_of(k) == 1).unwrap();
    let binary = |key: &str| base64_of(&steady_proto::autosharding::key_bytes(SliceKey::of(key)));
    for key in [key0, key1] {
        let request =
            http::Request::builder().header("x-slice-key-bin", binary(key)).body(String::new()).unwrap();
        stack.ready().await.unwrap().call(request).await.unwrap();
    }
    // Unreadable: served, not counted.
    let request =
        http::Request::builder().header("x-slice-key-bin", "not base64").body(String::new()).unwrap();
    stack.ready().await.unwrap().call(request).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    let report = slicelet.load_report("users").unwrap();
    assert!(report.slices().iter().any(|&(start, rate)| start == SliceKey(0) && rate > 0.0), "{report:?}");
    assert_eq!(slicelet.misrouted(), 1, "the slice-1 key was recorded, as a misroute");
}

/// Standard base64 with padding, as gRPC writes `-bin` headers.
fn base64_of(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    while out.len() % 4 != 0 {
        out.push('=');
    }
    out
}
