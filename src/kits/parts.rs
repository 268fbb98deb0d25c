//! Parts held open by a sink subtask (one per partition folder), and which to close
//! early: under a bound on the memory they hold together, or on how many are open.
//! Plain decisions over `(folder, size)`, for the file sink's parts and the Iceberg
//! sink's data files.

/// Which open parts (by folder) to close so that those left hold at most half of
/// `bound`, once together they hold more than `bound`: the largest first, so that the
/// fewest, fullest files are made. None while they hold at most `bound`.
pub fn parts_to_close(sizes: &[(String, u64)], bound: u64) -> Vec<String> {
    let mut total: u64 = sizes.iter().map(|(_, s)| s).sum();
    if total <= bound {
        return Vec::new();
    }
    let mut by_size: Vec<&(String, u64)> = sizes.iter().collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut out = Vec::new();
    for (folder, size) in by_size {
        if total <= bound / 2 {
            break;
        }
        total -= size;
        out.push(folder.clone());
    }
    out
}

/// Which open parts (by folder) to close once more than `max` are open, so that half
/// of `max` stay open: the largest first (each open file is a descriptor and a buffer).
pub fn parts_over_count(sizes: &[(String, u64)], max: usize) -> Vec<String> {
    if sizes.len() <= max {
        return Vec::new();
    }
    let mut by_size: Vec<&(String, u64)> = sizes.iter().collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    by_size
        .into_iter()
        .take(sizes.len() - max / 2)
        .map(|(f, _)| f.clone())
        .collect()
}

/// A name for one open of a subtask's writer, so that files named by it are never
/// those of an earlier open (an attempt that crashed): the time of the open, in
/// hexadecimal nanoseconds.
pub fn writer_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_most_open_files_the_largest_close_down_to_half() {
        let sizes: Vec<(String, u64)> = (0..5).map(|i| (format!("f{i}"), i)).collect();
        assert!(parts_over_count(&sizes, 5).is_empty());
        assert_eq!(parts_over_count(&sizes, 4), vec!["f4", "f3", "f2"]);
    }

    #[test]
    fn the_largest_parts_close_once_together_they_pass_the_bound() {
        let sizes = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(f, s)| (f.to_string(), *s)).collect()
        };
        assert!(parts_to_close(&sizes(&[("a", 50), ("b", 50)]), 100).is_empty());
        assert_eq!(
            parts_to_close(&sizes(&[("a", 10), ("b", 60), ("c", 40)]), 100),
            vec!["b"],
            "down to half the bound"
        );
        assert_eq!(
            parts_to_close(&sizes(&[("a", 30), ("b", 30), ("c", 30), ("d", 30)]), 100),
            vec!["a", "b", "c"],
            "equal sizes close in folder order"
        );
        assert_eq!(parts_to_close(&sizes(&[("a", 500)]), 100), vec!["a"]);
    }
}
