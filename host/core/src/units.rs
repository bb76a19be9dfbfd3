//! Parsing of human-friendly durations (`500ms`, `30s`, `2m`) and sizes (`64MiB`, `1G`).

use std::time::Duration;

/// Parses a duration: a number with a unit `ms`, `s`, `m` or `h` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a duration; use e.g. 500ms, 30s, 2m or 1h"))?;
    let secs = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!("unknown duration unit `{other}` in `{text}`; use ms, s, m or h"));
        }
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 7.0 * 86400.0 {
        return Err(format!("duration `{text}` must be positive and at most a week"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// An age: a whole number and a unit — `s`, `m`, `h`, `d` or `w` (`90m`, `30d`, `0s`).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 =
        number.parse().map_err(|_| format!("`{text}` is not an age such as 90m or 30d"))?;
    let secs = match unit {
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("`{text}`: the unit is s, m, h, d or w (e.g. 30d)")),
    };
    n.checked_mul(secs)
        .filter(|s| *s <= 100 * 365 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is more than a hundred years"))
}

/// A duration as people write it, in the units [`parse_duration`] reads: `250ms`, `1.5s`,
/// `120s`, `5m`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) && ms >= 300_000 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// A time in milliseconds since the Unix epoch as UTC, `2026-12-01T09:50:43.123Z`.
pub fn format_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // The proleptic Gregorian date of a day count, by 400-year eras of 146 097 days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        ms.rem_euclid(1000)
    )
}

/// A size as people write it, in the units [`parse_size`] reads: `64MiB` when it is a whole
/// number of a binary unit, else bytes (`1500B`).
pub fn format_size(bytes: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    format!("{bytes}B")
}

/// Parses a size in bytes: a number with an optional unit `B`, `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB` (binary multiples; `KB`, `MB`, `GB` are read the same way).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 =
        num.parse().map_err(|_| format!("`{text}` is not a size; use e.g. 64MiB, 512K or 1G"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` in `{text}`; use K, M or G")),
    };
    value.checked_mul(mult).ok_or_else(|| format!("size `{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_age_has_a_unit_and_no_week_limit() {
        assert_eq!(parse_age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_age("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert!(parse_age("30").unwrap_err().contains("the unit is"));
        assert!(parse_age("d").unwrap_err().contains("not an age"));
        assert!(parse_age("99999999999w").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_time(1_796_118_643_123), "2026-12-01T09:50:43.123Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn formatted_durations_read_back() {
        for (ms, text) in [(250, "250ms"), (1500, "1.5s"), (120_000, "120s"), (300_000, "5m")] {
            let d = Duration::from_millis(ms);
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d));
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        for n in [0, 1500, 64 << 20, 1 << 30, 3 << 10] {
            assert_eq!(parse_size(&format_size(n)), Ok(n), "{n}");
        }
        assert_eq!(format_size(256 << 20), "256MiB");
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }
}
