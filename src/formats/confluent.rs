//! The Confluent wire format, as its serializers write it: a magic byte 0, the schema's
//! registry id (4 bytes, big-endian), then the encoded value. Protobuf values carry,
//! between the id and the message, the path of the message type within its file: a
//! zigzag varint count followed by that many zigzag varint indexes, where a lone 0
//! stands for `[0]` (the first message).
//!
//! Plain functions over bytes; what cannot be read says why, for `on_decode_error`.

/// The magic byte of every framed value.
pub const MAGIC: u8 = 0;

/// A framed value: the writer schema's registry id and the encoded value after it.
#[derive(Debug, PartialEq, Eq)]
pub struct Framed<'a> {
    pub schema_id: u32,
    pub body: &'a [u8],
}

/// Reads the frame of `payload`.
pub fn unframe(payload: &[u8]) -> Result<Framed<'_>, String> {
    match payload {
        [] => Err("an empty payload has no schema id (not Confluent-framed)".into()),
        [m, ..] if *m != MAGIC => Err(format!(
            "magic byte {m} where a Confluent-framed value starts with 0 (not written by a Schema Registry serializer)"
        )),
        [_, a, b, c, d, body @ ..] => Ok(Framed {
            schema_id: u32::from_be_bytes([*a, *b, *c, *d]),
            body,
        }),
        _ => Err(format!(
            "{} bytes: too short for a magic byte and a schema id",
            payload.len()
        )),
    }
}

/// Reads the Protobuf message-index path at the start of `body`: the indexes (`[0]`
/// for the first message of the file) and the message after them.
pub fn message_indexes(body: &[u8]) -> Result<(Vec<u32>, &[u8]), String> {
    let (count, mut rest) = zigzag_varint(body)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if count < 0 || count as usize > rest.len() {
        return Err(format!("a message-index count of {count} cannot be right"));
    }
    let mut indexes = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (i, r) = zigzag_varint(rest)?;
        let i = u32::try_from(i).map_err(|_| format!("a message index of {i}"))?;
        indexes.push(i);
        rest = r;
    }
    Ok((indexes, rest))
}

/// One zigzag-encoded varint (at most 10 bytes) and what follows it.
pub fn zigzag_varint(b: &[u8]) -> Result<(i64, &[u8]), String> {
    let mut n: u64 = 0;
    for (i, &byte) in b.iter().enumerate().take(10) {
        n |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let v = ((n >> 1) as i64) ^ -((n & 1) as i64);
            return Ok((v, &b[i + 1..]));
        }
    }
    Err("a varint that does not end".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_the_magic_byte_an_id_and_the_value() {
        assert_eq!(
            unframe(&[0, 0, 0, 1, 7, 0xaa, 0xbb]),
            Ok(Framed {
                schema_id: 263,
                body: &[0xaa, 0xbb]
            })
        );
        assert_eq!(
            unframe(&[0, 0xff, 0xff, 0xff, 0xff]),
            Ok(Framed {
                schema_id: u32::MAX,
                body: &[]
            })
        );
        let errors = [
            (&[][..], "empty"),
            (&[1, 0, 0, 0, 1][..], "magic byte 1"),
            (b"{\"a\":1}", "magic byte 123"),
            (&[0, 0, 0][..], "too short"),
        ];
        for (payload, want) in errors {
            let e = unframe(payload).unwrap_err();
            assert!(e.contains(want), "{payload:?}: {e}");
        }
    }

    #[test]
    fn protobuf_message_indexes_with_the_single_zero_shorthand() {
        assert_eq!(message_indexes(&[0, 9]), Ok((vec![0], &[9][..])));
        // count 2 (zigzag 4), indexes 1 (2) and 3 (6).
        assert_eq!(message_indexes(&[4, 2, 6, 9]), Ok((vec![1, 3], &[9][..])));
        assert!(
            message_indexes(&[4, 2]).is_err(),
            "fewer indexes than counted"
        );
        assert!(message_indexes(&[1]).is_err(), "a negative count");
        assert!(message_indexes(&[0x80]).is_err(), "an unfinished varint");
    }

    #[test]
    fn zigzag_varints_round_the_sign() {
        let cases: [(&[u8], i64); 6] = [
            (&[0], 0),
            (&[1], -1),
            (&[2], 1),
            (&[0x7f], -64),
            (&[0x80, 0x01], 64),
            (
                &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                i64::MAX,
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(zigzag_varint(bytes).map(|(v, _)| v), Ok(want), "{bytes:?}");
        }
    }
}
