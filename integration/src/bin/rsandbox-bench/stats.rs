//! Samples and their summary: p50 / p95 / min / max (nearest-rank percentiles).

use std::time::Duration;

/// Measured values of one metric for one handler, in the metric's unit (ms, MiB, ...).
#[derive(Debug, Clone, Default)]
pub struct Samples(pub Vec<f64>);

/// p50 / p95 / min / max and the sample count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

impl Samples {
    pub fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    /// None without samples.
    pub fn summary(&self) -> Option<Summary> {
        if self.0.is_empty() {
            return None;
        }
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        Some(Summary {
            n: v.len(),
            p50: percentile(&v, 50.0),
            p95: percentile(&v, 95.0),
            min: v[0],
            max: v[v.len() - 1],
            mean,
        })
    }
}

/// Milliseconds, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Microseconds, as a float.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Nearest-rank percentile of sorted, non-empty `v`: the smallest value with at least `q`% of
/// the samples at or below it.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// `a / b`, None when `b` is not positive.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 10.0);
        assert_eq!(percentile(&v, 95.0), 19.0);
        assert_eq!(percentile(&v, 100.0), 20.0);
        assert_eq!(percentile(&[7.0], 95.0), 7.0);
        assert_eq!(percentile(&[1.0, 2.0], 0.0), 1.0);
    }

    #[test]
    fn summary_of_unsorted_samples() {
        let s = Samples(vec![5.0, 1.0, 3.0, 2.0, 4.0]).summary().unwrap();
        assert_eq!((s.n, s.p50, s.p95, s.min, s.max), (5, 3.0, 5.0, 1.0, 5.0));
        assert_eq!(s.mean, 3.0);
        assert!(Samples::default().summary().is_none());
    }

    #[test]
    fn ratio_needs_a_positive_divisor() {
        assert_eq!(ratio(1.0, 2.0), Some(0.5));
        assert_eq!(ratio(1.0, 0.0), None);
    }
}
