//! Log sequence numbers: positions in PostgreSQL's write-ahead log, a 64-bit number
//! written `X/Y` (the high and low 32 bits in hexadecimal), as `pg_current_wal_lsn()`
//! and `pg_replication_slots` show them.

/// Parses `X/Y` (hexadecimal, each at most 32 bits).
pub fn parse(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a log sequence number (X/Y in hexadecimal)");
    let (high, low) = text.trim().split_once('/').ok_or_else(bad)?;
    let half = |s: &str| {
        (!s.is_empty() && s.len() <= 8 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
            .ok_or_else(bad)
    };
    Ok((u64::from(half(high)?) << 32) | u64::from(half(low)?))
}

/// `lsn` as PostgreSQL writes it (`16/B374D848`).
pub fn format(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_and_writes_as_postgres_shows_it() {
        for (text, n) in [
            ("0/0", 0u64),
            ("16/B374D848", 0x16_B374_D848),
            ("FFFFFFFF/FFFFFFFF", u64::MAX),
            ("0/1", 1),
        ] {
            assert_eq!(parse(text).unwrap(), n, "{text}");
            assert_eq!(format(n), text);
        }
        assert_eq!(parse("16/b374d848").unwrap(), 0x16_B374_D848, "either case");
        for bad in [
            "",
            "16",
            "/1",
            "1/",
            "1/2/3",
            "G/0",
            "100000000/0",
            "-1/0",
            "+1/0",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
