//! Summaries of a metric over many scenarios: mean, the bad tail and the worst.

/// Which way a metric improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Utilisation, diversity: the bad end is low.
    Higher,
    /// Churn, spread: the bad end is high.
    Lower,
}

/// A metric's mean, its value at the worst decile and its worst value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The arithmetic mean.
    pub mean: f64,
    /// The 10th percentile from the bad end (p10 when higher is better, p90 otherwise),
    /// nearest-rank.
    pub tail: f64,
    /// The worst value (minimum when higher is better, maximum otherwise).
    pub worst: f64,
}

impl Summary {
    /// Summarises `values`; `None` when there are none (or any is NaN).
    pub fn of(values: &[f64], better: Better) -> Option<Self> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        if better == Better::Lower {
            sorted.reverse();
        }
        // Nearest rank: the ceil(n / 10)-th worst value.
        let rank = sorted.len().div_ceil(10) - 1;
        Some(Self {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            tail: sorted[rank],
            worst: sorted[0],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_and_worst_follow_the_direction() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        let hi = Summary::of(&v, Better::Higher).unwrap();
        assert_eq!((hi.mean, hi.tail, hi.worst), (10.5, 2.0, 1.0));
        let lo = Summary::of(&v, Better::Lower).unwrap();
        assert_eq!((lo.tail, lo.worst), (19.0, 20.0));
        assert_eq!(Summary::of(&[], Better::Lower), None);
        assert_eq!(Summary::of(&[0.5], Better::Higher).unwrap().tail, 0.5);
    }
}
