//! Measurement helpers: CPU time, medians and spreads, and a description of the machine.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// User + system CPU-seconds of this whole process (every thread) so far.
pub fn process_cpu_seconds() -> Result<f64> {
    cpu_seconds(libc::RUSAGE_SELF)
}

/// User + system CPU-seconds of the calling thread so far.
pub fn thread_cpu_seconds() -> Result<f64> {
    cpu_seconds(libc::RUSAGE_THREAD)
}

fn cpu_seconds(who: libc::c_int) -> Result<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a `rusage` into the valid pointer it is given; `who` is
    // RUSAGE_SELF or RUSAGE_THREAD (our two callers).
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    if rc != 0 {
        bail!("getrusage failed: {}", std::io::Error::last_os_error());
    }
    // SAFETY: initialised by the successful call above.
    let u = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(secs(u.ru_utime) + secs(u.ru_stime))
}

/// Median and range of repeated measurements of one figure.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// The median (the lower middle value of an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// How many values.
    pub n: usize,
}

impl Summary {
    /// Summarises `values`; NaN for an empty list.
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.to_vec();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Self {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                n: 0,
            };
        }
        Self {
            median: v[(v.len() - 1) / 2],
            min: v[0],
            max: v[v.len() - 1],
            n: v.len(),
        }
    }

    /// `median (min–max)` with `decimals` decimals.
    pub fn show(&self, decimals: usize) -> String {
        if self.n <= 1 {
            return format!("{:.*}", decimals, self.median);
        }
        format!(
            "{:.*} ({:.*}–{:.*})",
            decimals, self.median, decimals, self.min, decimals, self.max
        )
    }

    /// Like [`Summary::show`], for a figure shown beside a goal of `threshold`: a median
    /// that would read as the threshold itself shows a decimal more (see [`against`]).
    pub fn show_against(&self, threshold: f64, decimals: usize) -> String {
        let median = against(self.median, threshold, decimals);
        if self.n <= 1 {
            return median;
        }
        format!(
            "{median} ({:.*}–{:.*})",
            decimals, self.min, decimals, self.max
        )
    }

    /// Like [`Summary::show`] for large counts: with a metric suffix.
    pub fn show_count(&self) -> String {
        if self.n <= 1 {
            return metric(self.median);
        }
        format!(
            "{} ({}–{})",
            metric(self.median),
            metric(self.min),
            metric(self.max)
        )
    }
}

/// A rate or count with a metric suffix: `4.81 M`, `512.0 k`, `37`.
pub fn metric(x: f64) -> String {
    let a = x.abs();
    if !x.is_finite() {
        format!("{x}")
    } else if a >= 1e9 {
        format!("{:.2} G", x / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if a >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The `p`-th percentile (0–100) of sorted values, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What the report says about the machine it ran on.
#[derive(Debug, Clone)]
pub struct Machine {
    /// CPU model, from /proc/cpuinfo.
    pub cpu: String,
    /// Logical CPUs this process may use.
    pub cores: usize,
    /// Total memory, from /proc/meminfo.
    pub memory: String,
    /// Operating system and kernel.
    pub os: String,
    /// Size of /dev/shm.
    pub shm: String,
}

impl Machine {
    /// Reads the description from /proc and /etc; unknown parts say "unknown".
    pub fn describe() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown CPU".to_string(), |(_, v)| v.trim().to_string());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let memory = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or_else(
                || "unknown".to_string(),
                |kb| format!("{:.1} GiB", kb / (1024.0 * 1024.0)),
            );
        let os_name = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map_or_else(|| "Linux".to_string(), |v| v.trim_matches('"').to_string());
        let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
        let shm = sluice::shm::shm_available().map_or_else(
            |_| "unknown".to_string(),
            |b| format!("{:.1} GiB free", b as f64 / (1u64 << 30) as f64),
        );
        Self {
            cpu,
            cores,
            memory,
            os: format!("{os_name}, kernel {kernel}"),
            shm,
        }
    }
}

/// Output of a command, trimmed; `None` if it cannot run or fails.
pub fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The current time as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> Result<String> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    Ok(format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    ))
}

/// `value` with `decimals` decimals, or one more where those would show it as `threshold`
/// itself: a goal's figure beside its verdict ("0.90" beside "not met" for 0.896 against
/// a goal of 0.90, "10.0×" for 9.96 against 10×) reads as a contradiction.
pub fn against(value: f64, threshold: f64, decimals: usize) -> String {
    let shown = format!("{value:.decimals$}");
    if value != threshold && shown == format!("{threshold:.decimals$}") {
        format!("{value:.0$}", decimals + 1)
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reports_median_and_range() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
    }

    #[test]
    fn large_numbers_get_a_metric_suffix() {
        assert_eq!(metric(1_234_567.4), "1.23 M");
        assert_eq!(metric(2_500.0), "2.5 k");
        assert_eq!(metric(12.0), "12");
    }

    #[test]
    fn a_ratio_next_to_its_goal_shows_which_side_it_is_on() {
        assert_eq!(against(0.8957, 0.9, 2), "0.896");
        assert_eq!(against(0.9041, 0.9, 2), "0.904");
        assert_eq!(against(0.9, 0.9, 2), "0.90");
        assert_eq!(against(0.84, 0.9, 2), "0.84");
        assert_eq!(against(9.96, 10.0, 1), "9.96");
        assert_eq!(against(79.6, 80.0, 0), "79.6");
        assert_eq!(against(9.4, 10.0, 1), "9.4");
        let p99 = Summary::of(&[49.0, 50.4, 54.2]);
        assert_eq!(p99.show_against(50.0, 0), "50.4 (49–54)");
        assert_eq!(Summary::of(&[0.331]).show_against(0.35, 2), "0.33");
    }
}
