//! The latency percentile the lab and the throughput benchmark report.

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
