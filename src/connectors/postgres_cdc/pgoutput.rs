//! The messages of PostgreSQL's `pgoutput` logical decoding plugin (protocol version
//! 1), decoded from the bytes of a replication stream's `XLogData`.
//!
//! The formats are PostgreSQL's "Logical Replication Message Formats". Every read is
//! bounds-checked: a message cut short or of an unknown kind is an error naming what
//! was being read, never a panic, so that a server newer than this decoder fails the
//! source with a message rather than the process.

use bytes::Bytes;

/// A relation (table) as the stream describes it before its first change, and again
/// after its definition changed: the columns of the tuples that follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    /// The schema (`public`); pgoutput sends an empty name for `pg_catalog`.
    pub namespace: String,
    pub name: String,
    /// `REPLICA IDENTITY`: `d` default (the primary key), `n` nothing, `f` full, `i`
    /// an index.
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

/// A column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Part of the replica identity's key (the primary key by default).
    pub key: bool,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// One column's value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    /// A TOASTed value the change did not touch: the stream does not send it again.
    Unchanged,
    /// The value in the type's text form.
    Text(Bytes),
    /// The value in the type's binary form (when the subscription asks for it).
    Binary(Bytes),
}

/// The old row of an update or delete, as much of it as `REPLICA IDENTITY` logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Old {
    /// The key columns only (the others null).
    Key(Vec<Value>),
    /// Every column (`REPLICA IDENTITY FULL`).
    Full(Vec<Value>),
}

/// One pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin {
        /// The LSN of the transaction's commit record.
        final_lsn: u64,
        /// Microseconds since 2000-01-01 UTC.
        commit_time: i64,
        xid: u32,
    },
    Commit {
        commit_lsn: u64,
        /// The LSN just past the commit record: a replication started there does not
        /// send this transaction again.
        end_lsn: u64,
        commit_time: i64,
    },
    Origin {
        commit_lsn: u64,
        name: String,
    },
    Relation(Relation),
    Type {
        oid: u32,
        namespace: String,
        name: String,
    },
    Insert {
        relation: u32,
        new: Vec<Value>,
    },
    Update {
        relation: u32,
        /// None when the replica identity's key did not change and the identity is
        /// not `FULL`.
        old: Option<Old>,
        new: Vec<Value>,
    },
    Delete {
        relation: u32,
        old: Old,
    },
    Truncate {
        /// Bit 1: `CASCADE`; bit 2: `RESTART IDENTITY`.
        options: u8,
        relations: Vec<u32>,
    },
    /// A message written by `pg_logical_emit_message`.
    Logical {
        transactional: bool,
        lsn: u64,
        prefix: String,
        content: Bytes,
    },
}

/// Decodes one message (the whole payload of one `XLogData`).
pub fn decode(data: &Bytes) -> Result<Message, String> {
    let mut r = Reader { data, at: 0 };
    let kind = r.u8("the message's kind")?;
    let message = match kind {
        b'B' => Message::Begin {
            final_lsn: r.u64("Begin's final LSN")?,
            commit_time: r.i64("Begin's commit time")?,
            xid: r.u32("Begin's transaction id")?,
        },
        b'C' => {
            r.u8("Commit's flags")?;
            Message::Commit {
                commit_lsn: r.u64("Commit's LSN")?,
                end_lsn: r.u64("Commit's end LSN")?,
                commit_time: r.i64("Commit's time")?,
            }
        }
        b'O' => Message::Origin {
            commit_lsn: r.u64("Origin's LSN")?,
            name: r.string("Origin's name")?,
        },
        b'R' => {
            let oid = r.u32("Relation's id")?;
            let namespace = r.string("Relation's namespace")?;
            let name = r.string("Relation's name")?;
            let replica_identity = r.u8("Relation's replica identity")?;
            let n = r.u16("Relation's number of columns")?;
            let mut columns = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                let flags = r.u8("a column's flags")?;
                columns.push(Column {
                    key: flags & 1 == 1,
                    name: r.string("a column's name")?,
                    type_oid: r.u32("a column's type")?,
                    type_modifier: r.i32("a column's type modifier")?,
                });
            }
            Message::Relation(Relation {
                oid,
                namespace,
                name,
                replica_identity,
                columns,
            })
        }
        b'Y' => Message::Type {
            oid: r.u32("Type's id")?,
            namespace: r.string("Type's namespace")?,
            name: r.string("Type's name")?,
        },
        b'I' => {
            let relation = r.u32("Insert's relation")?;
            r.tag(b'N', "Insert's new tuple")?;
            Message::Insert {
                relation,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let relation = r.u32("Update's relation")?;
            let old = match r.u8("Update's tuple kind")? {
                b'K' => Some(Old::Key(r.tuple()?)),
                b'O' => Some(Old::Full(r.tuple()?)),
                b'N' => None,
                other => return Err(unexpected(other, "Update's tuple kind")),
            };
            if old.is_some() {
                r.tag(b'N', "Update's new tuple")?;
            }
            Message::Update {
                relation,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            let relation = r.u32("Delete's relation")?;
            let old = match r.u8("Delete's tuple kind")? {
                b'K' => Old::Key(r.tuple()?),
                b'O' => Old::Full(r.tuple()?),
                other => return Err(unexpected(other, "Delete's tuple kind")),
            };
            Message::Delete { relation, old }
        }
        b'T' => {
            let n = r.u32("Truncate's number of relations")?;
            let options = r.u8("Truncate's options")?;
            let relations = (0..n)
                .map(|_| r.u32("a truncated relation"))
                .collect::<Result<_, _>>()?;
            Message::Truncate { options, relations }
        }
        b'M' => {
            let flags = r.u8("Message's flags")?;
            let lsn = r.u64("Message's LSN")?;
            let prefix = r.string("Message's prefix")?;
            let len = r.u32("Message's length")?;
            Message::Logical {
                transactional: flags & 1 == 1,
                lsn,
                prefix,
                content: r.bytes(len, "Message's content")?,
            }
        }
        other => return Err(unexpected(other, "a pgoutput message's kind")),
    };
    if r.at != data.len() {
        return Err(format!(
            "pgoutput: {} bytes after a whole message of kind {:?}",
            data.len() - r.at,
            char::from(kind)
        ));
    }
    Ok(message)
}

fn unexpected(byte: u8, what: &str) -> String {
    format!("pgoutput: unexpected {:?} as {what}", char::from(byte))
}

/// Reads a message's fields in order, each checked against what is left.
struct Reader<'a> {
    data: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.data.len())
            .ok_or_else(|| format!("pgoutput: the message ends before {what}"))?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let bytes = self.take(N, what)?;
        Ok(bytes.try_into().expect("took N bytes"))
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, String> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    fn tag(&mut self, expected: u8, what: &str) -> Result<(), String> {
        match self.u8(what)? {
            b if b == expected => Ok(()),
            other => Err(unexpected(other, what)),
        }
    }

    /// A null-terminated string.
    fn string(&mut self, what: &str) -> Result<String, String> {
        let rest = &self.data[self.at..];
        let len = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| format!("pgoutput: {what} has no end"))?;
        let s = String::from_utf8(rest[..len].to_vec())
            .map_err(|_| format!("pgoutput: {what} is not UTF-8"))?;
        self.at += len + 1;
        Ok(s)
    }

    /// `len` bytes, shared with the message (no copy).
    fn bytes(&mut self, len: u32, what: &str) -> Result<Bytes, String> {
        let n = usize::try_from(len).map_err(|_| format!("pgoutput: {what} is too long"))?;
        let start = self.at;
        self.take(n, what)?;
        Ok(self.data.slice(start..self.at))
    }

    fn tuple(&mut self) -> Result<Vec<Value>, String> {
        let n = self.u16("a tuple's number of columns")?;
        (0..n)
            .map(|_| {
                Ok(match self.u8("a column's kind")? {
                    b'n' => Value::Null,
                    b'u' => Value::Unchanged,
                    b't' => {
                        let len = self.u32("a text value's length")?;
                        Value::Text(self.bytes(len, "a text value")?)
                    }
                    b'b' => {
                        let len = self.u32("a binary value's length")?;
                        Value::Binary(self.bytes(len, "a binary value")?)
                    }
                    other => return Err(unexpected(other, "a column's kind")),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds message bytes as the server writes them.
    #[derive(Default)]
    struct Out(Vec<u8>);

    impl Out {
        fn u8(mut self, v: u8) -> Out {
            self.0.push(v);
            self
        }
        fn u16(mut self, v: u16) -> Out {
            self.0.extend(v.to_be_bytes());
            self
        }
        fn u32(mut self, v: u32) -> Out {
            self.0.extend(v.to_be_bytes());
            self
        }
        fn u64(mut self, v: u64) -> Out {
            self.0.extend(v.to_be_bytes());
            self
        }
        fn s(mut self, v: &str) -> Out {
            self.0.extend(v.as_bytes());
            self.0.push(0);
            self
        }
        fn text(self, v: &str) -> Out {
            let out = self.u8(b't').u32(v.len() as u32);
            let mut b = out.0;
            b.extend(v.as_bytes());
            Out(b)
        }
        fn done(self) -> Bytes {
            Bytes::from(self.0)
        }
    }

    fn text(v: &str) -> Value {
        Value::Text(Bytes::from(v.to_string()))
    }

    #[test]
    fn a_transaction_s_frame_and_a_relation_decode_field_by_field() {
        let begin = Out::default()
            .u8(b'B')
            .u64(0x16_B374_D848)
            .u64(789)
            .u32(4242)
            .done();
        assert_eq!(
            decode(&begin).unwrap(),
            Message::Begin {
                final_lsn: 0x16_B374_D848,
                commit_time: 789,
                xid: 4242
            }
        );
        let commit = Out::default().u8(b'C').u8(0).u64(10).u64(20).u64(30).done();
        assert_eq!(
            decode(&commit).unwrap(),
            Message::Commit {
                commit_lsn: 10,
                end_lsn: 20,
                commit_time: 30
            }
        );
        let relation = Out::default()
            .u8(b'R')
            .u32(16384)
            .s("public")
            .s("orders")
            .u8(b'd')
            .u16(2)
            .u8(1)
            .s("id")
            .u32(20)
            .u32(u32::MAX)
            .u8(0)
            .s("note")
            .u32(25)
            .u32(u32::MAX)
            .done();
        let Message::Relation(r) = decode(&relation).unwrap() else {
            panic!("a relation")
        };
        assert_eq!(
            (r.oid, r.namespace.as_str(), r.name.as_str()),
            (16384, "public", "orders")
        );
        assert_eq!(r.replica_identity, b'd');
        assert_eq!(
            r.columns,
            vec![
                Column {
                    key: true,
                    name: "id".into(),
                    type_oid: 20,
                    type_modifier: -1
                },
                Column {
                    key: false,
                    name: "note".into(),
                    type_oid: 25,
                    type_modifier: -1
                }
            ]
        );
    }

    #[test]
    fn changes_carry_their_tuples_with_nulls_and_untouched_toast_told_apart() {
        let insert = Out::default()
            .u8(b'I')
            .u32(7)
            .u8(b'N')
            .u16(3)
            .text("1")
            .u8(b'n')
            .text("é")
            .done();
        assert_eq!(
            decode(&insert).unwrap(),
            Message::Insert {
                relation: 7,
                new: vec![text("1"), Value::Null, text("é")]
            }
        );
        let update = Out::default()
            .u8(b'U')
            .u32(7)
            .u8(b'N')
            .u16(2)
            .text("1")
            .u8(b'u')
            .done();
        assert_eq!(
            decode(&update).unwrap(),
            Message::Update {
                relation: 7,
                old: None,
                new: vec![text("1"), Value::Unchanged]
            }
        );
        let key_changed = Out::default()
            .u8(b'U')
            .u32(7)
            .u8(b'K')
            .u16(2)
            .text("1")
            .u8(b'n')
            .u8(b'N')
            .u16(2)
            .text("2")
            .text("x")
            .done();
        assert_eq!(
            decode(&key_changed).unwrap(),
            Message::Update {
                relation: 7,
                old: Some(Old::Key(vec![text("1"), Value::Null])),
                new: vec![text("2"), text("x")]
            }
        );
        let delete = Out::default()
            .u8(b'D')
            .u32(7)
            .u8(b'O')
            .u16(2)
            .text("2")
            .text("x")
            .done();
        assert_eq!(
            decode(&delete).unwrap(),
            Message::Delete {
                relation: 7,
                old: Old::Full(vec![text("2"), text("x")])
            }
        );
        let truncate = Out::default().u8(b'T').u32(2).u8(1).u32(7).u32(8).done();
        assert_eq!(
            decode(&truncate).unwrap(),
            Message::Truncate {
                options: 1,
                relations: vec![7, 8]
            }
        );
        let mut logical = Out::default().u8(b'M').u8(1).u64(99).s("lockgate").u32(3).0;
        logical.extend(b"abc");
        assert_eq!(
            decode(&Bytes::from(logical)).unwrap(),
            Message::Logical {
                transactional: true,
                lsn: 99,
                prefix: "lockgate".into(),
                content: Bytes::from_static(b"abc")
            }
        );
    }

    #[test]
    fn a_message_cut_short_or_of_an_unknown_kind_is_an_error_naming_what_was_read() {
        let insert = Out::default()
            .u8(b'I')
            .u32(7)
            .u8(b'N')
            .u16(1)
            .text("12345")
            .done();
        for cut in 0..insert.len() {
            let err = decode(&insert.slice(..cut)).unwrap_err();
            assert!(err.starts_with("pgoutput:"), "{cut}: {err}");
        }
        let mut long = insert.to_vec();
        long.push(0);
        assert!(decode(&Bytes::from(long))
            .unwrap_err()
            .contains("after a whole message"));
        assert!(decode(&Bytes::from_static(b"Z"))
            .unwrap_err()
            .contains("'Z'"));
        let bad_kind = Out::default()
            .u8(b'I')
            .u32(7)
            .u8(b'N')
            .u16(1)
            .u8(b'x')
            .done();
        assert!(decode(&bad_kind).unwrap_err().contains("a column's kind"));
        let huge = Out::default()
            .u8(b'I')
            .u32(7)
            .u8(b'N')
            .u16(1)
            .u8(b't')
            .u32(u32::MAX)
            .done();
        assert!(decode(&huge)
            .unwrap_err()
            .contains("ends before a text value"));
    }
}
