//! Members: one job run as N processes (`lockgate run --member I --members N`), each
//! the whole job graph over its share of the input, with its own coordinator and its
//! own line of checkpoints. Members share nothing while running, so each is
//! exactly-once on its own and one member's crash never stops another.
//!
//! This module holds who a member is and where its line is. Which splits a member
//! reads is the source's assignment ([`crate::connector::splits`]); what a member's
//! start does given every line of the checkpoint directory is
//! [`crate::checkpoint::line_plan`].

use std::fmt;

/// Member `index` of `count`. The default, [`Member::SOLO`], is a job run as one
/// process: its line is the checkpoint directory itself, as before members existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub index: u16,
    pub count: u16,
}

impl Default for Member {
    fn default() -> Member {
        Member::SOLO
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "member {} of {}", self.index, self.count)
    }
}

impl Member {
    /// The job as one process.
    pub const SOLO: Member = Member { index: 0, count: 1 };

    /// Member `index` of `count`; an index outside `0..count` is refused.
    pub fn new(index: u16, count: u16) -> Result<Member, String> {
        if count == 0 {
            return Err("--members must be at least 1".into());
        }
        if index >= count {
            return Err(format!(
                "--member {index} is not below --members {count} (members count from 0)"
            ));
        }
        Ok(Member { index, count })
    }

    /// The member of a StatefulSet pod: the index is the number after the last `-` of
    /// `hostname` (`orders-to-es-2` is member 2).
    pub fn from_hostname(hostname: &str, count: u16) -> Result<Member, String> {
        let digits = hostname.rsplit_once('-').map(|(_, d)| d).unwrap_or("");
        let index: u16 = match digits.parse() {
            Ok(i) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => i,
            _ => {
                return Err(format!(
                    "--member-from-hostname: host name {hostname:?} does not end in -INDEX (a StatefulSet pod is NAME-0, NAME-1, ...)"
                ))
            }
        };
        Member::new(index, count)
    }

    /// The directory of this member's line below the checkpoint directory
    /// (`member-I-of-N`), or `None` for a single member, whose line is the checkpoint
    /// directory itself (so that a job that was never split keeps its layout).
    pub fn line(&self) -> Option<String> {
        (self.count > 1).then(|| format!("member-{}-of-{}", self.index, self.count))
    }

    /// The member whose line is the directory `name` (the inverse of [`Member::line`]).
    pub fn parse_line(name: &str) -> Option<Member> {
        let rest = name.strip_prefix("member-")?;
        let (i, n) = rest.split_once("-of-")?;
        let m = Member::new(i.parse().ok()?, n.parse().ok()?).ok()?;
        // Only the spelling `line` writes names a line: no sign, no leading zero, and
        // never one member (whose line is the checkpoint directory itself).
        (m.line().as_deref() == Some(name)).then_some(m)
    }

    /// Every member of a job run as `count` members.
    pub fn all(count: u16) -> impl Iterator<Item = Member> {
        (0..count).map(move |index| Member { index, count })
    }

    /// A name for the line, in messages.
    pub fn line_display(&self) -> String {
        self.line()
            .unwrap_or_else(|| "the checkpoint directory".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(index: u16, count: u16) -> Member {
        Member::new(index, count).unwrap()
    }

    #[test]
    fn members_and_their_lines() {
        assert!(Member::new(3, 3).is_err());
        assert!(Member::new(0, 0).is_err());
        assert_eq!(m(2, 3).line().as_deref(), Some("member-2-of-3"));
        assert_eq!(m(2, 3).to_string(), "member 2 of 3");
        assert_eq!(Member::SOLO.line(), None);
        assert_eq!(m(0, 1).line(), None);
        assert_eq!(Member::parse_line("member-2-of-3"), Some(m(2, 3)));
        for bad in [
            "member-3-of-3",
            "member-0-of-1",
            "member-02-of-3",
            "member--1-of-3",
            "member-1-of-3x",
            "chk-1",
            "member-+1-of-3",
        ] {
            assert_eq!(Member::parse_line(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_statefulset_pod_name_gives_the_index() {
        assert_eq!(Member::from_hostname("orders-to-es-2", 3), Ok(m(2, 3)));
        assert_eq!(Member::from_hostname("a-0", 1), Ok(Member::SOLO));
        let e = Member::from_hostname("orders-to-es-3", 3).unwrap_err();
        assert!(e.contains("not below --members 3"), "{e}");
        for bad in ["orders", "orders-", "orders-x1", "orders-+1", "7"] {
            let e = Member::from_hostname(bad, 3).unwrap_err();
            assert!(e.contains("does not end in -INDEX"), "{bad}: {e}");
        }
    }
}
