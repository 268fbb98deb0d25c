//! Deterministic assignment of partitions to source subtasks (Flink's assigner): the
//! start index comes from the topic name's hash, then partitions go round robin. The
//! same parallelism always gives the same owners; another parallelism redistributes
//! the restored union of positions.

/// Java's `String.hashCode`, over UTF-16 code units (Flink's assigner uses it, so the
/// owners match a Flink job's).
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The subtask (of `parallelism`) that reads `partition` of `topic`.
pub fn owner(topic: &str, partition: i32, parallelism: u16) -> u16 {
    let p = i32::from(parallelism);
    let start = (java_string_hash(topic).wrapping_mul(31) & 0x7FFF_FFFF) % p;
    ((start + partition) % p) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn java_hash_matches_java() {
        // Values computed by java.lang.String#hashCode.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("orders"), -1008770331);
        assert_eq!(java_string_hash("hello"), 99162322);
    }

    proptest! {
        #[test]
        fn partitions_of_a_topic_spread_evenly(topic in "[a-z]{1,12}", parts in 1i32..200, p in 1u16..32) {
            let mut counts = vec![0i32; usize::from(p)];
            for part in 0..parts {
                let o = owner(&topic, part, p);
                prop_assert!(o < p);
                counts[usize::from(o)] += 1;
            }
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(max - min <= 1, "round robin: {:?}", counts);
        }
    }
}
