//! Byte sizes in the config: a number of bytes, or a string with a unit,
//! binary (`Ki`, `Mi`, `Gi`, `Ti`) or decimal (`K`, `M`, `G`, `T`), as
//! Kubernetes writes quantities.

use serde::{Deserialize, Deserializer};

#[derive(Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

/// Reads `512Mi`, `2G` or `1048576`.
pub fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let at = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(at);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 512Mi, 2G or 1048576"))?;
    let scale: u64 = match unit {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (Ki, Mi, Gi, Ti, K, M, G, T)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<Size>::deserialize(d)? {
        None => Ok(None),
        Some(Size::Bytes(n)) => Ok(Some(n)),
        Some(Size::Text(t)) => parse(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_kubernetes_writes_them() {
        assert_eq!(parse("512Mi"), Ok(512 << 20));
        assert_eq!(parse("2G"), Ok(2_000_000_000));
        assert_eq!(parse("1048576"), Ok(1 << 20));
        assert_eq!(parse(" 3Ki "), Ok(3072));
        for bad in [
            "",
            "Mi",
            "1.5Gi",
            "12XB",
            "-1",
            "99999999999999999999",
            "18446744073709551615Ki",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
